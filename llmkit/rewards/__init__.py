"""Rewards of sampled responses for `llmkit ppo`: Python functions with TRL's reward signature
`(prompts, completions, **columns) -> list[float | None]`, named on the command line
(`--set reward=math,format,my_rewards.py:score`). `plugins.py` turns those names into callables
(built-ins, user files), calls them on a rollout and weighs their scores; the built-in verifiers
sit beside it (`math.py`: answer equivalence, `code.py`: code run in a sandbox).

No module here imports torch at import time: `llmkit --help` and a reward file's own import stay light.
"""
