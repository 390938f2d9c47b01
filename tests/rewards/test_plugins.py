"""Reward functions as plugins (llmkit.rewards.plugins): names, weights, user files loaded by
path, a reward that raises on one response, None, and the same TRL-style reward file giving the
same rewards in TRL's GRPOTrainer (its `_calculate_rewards`) and in llmkit on the same completions."""

import math
from pathlib import Path

import pytest
import torch

from llmkit.errors import ConfigError, UserError
from llmkit.rewards.plugins import (RewardScorer, load_reward_functions, reward_call, reward_names, reward_weights,
                                    score_rewards, trainer_state, combine)
from llmkit.rewards.text import format_reward_of
from llmkit.train.rollouts import Prompt, Samples

REWARD_FILE = Path(__file__).parents[1] / "assets" / "trl_style_rewards.py"
FUNCTIONS = ["correct_answer", "brevity", "echoes_the_prompt"]
WEIGHTS = [1.0, 0.5, 2.0]


# ---- names and weights --------------------------------------------------------------------------

def test_the_modes_of_before_and_the_named_rewards():
    assert reward_names("auto", has_reward_model=True) == ["model"]
    assert reward_names("auto", has_reward_model=False) == ["verify"]
    assert reward_names("mix", has_reward_model=True) == ["model", "verify"]
    assert reward_names(" math, format ,x.py:score", False) == ["math", "format", "x.py:score"]
    assert reward_weights(["model", "verify"], "mix", None, verify_weight=0.3) == [1.0, 0.3]
    assert reward_weights(["math", "format"], "math,format", [2, 0.5], 1.0) == [2.0, 0.5]


@pytest.mark.parametrize("spec, has_rm, message", [
    ("maths", False, "unknown reward 'maths' \\(did you mean math\\?\\)"),
    ("math,rewards.py", False, "rewards.py names a file but no function; write rewards.py:FUNCTION"),
    ("math,model", False, "needs a reward model: pass --reward RM"),
    ("math,math", False, "names a reward twice"),
    (" , ", False, "reward is empty"),
])
def test_a_bad_reward_name_is_refused_by_name(spec, has_rm, message):
    with pytest.raises(ConfigError, match=message):
        reward_names(spec, has_rm)


def test_weights_must_match_the_rewards():
    with pytest.raises(ConfigError, match="2 weights for 3 rewards"):
        reward_weights(["a.py:f", "b.py:g", "math"], "a.py:f,b.py:g,math", [1, 2], 1.0)
    with pytest.raises(ConfigError, match="name them"):
        reward_weights(["model", "verify"], "mix", [1, 2], 1.0)


# ---- loading user files -------------------------------------------------------------------------

def test_a_missing_file_or_function_is_named(tmp_path):
    with pytest.raises(UserError, match="no file .*nowhere.py"):
        load_reward_functions([f"{tmp_path}/nowhere.py:score"])
    with pytest.raises(UserError, match="trl_style_rewards.py has no function 'scores' \\(it defines brevity, content, "
                                        "correct_answer, echoes_the_prompt, fails_on_sevens\\)"):
        load_reward_functions([f"{REWARD_FILE}:scores"])


@pytest.mark.parametrize("source, message", [
    ("def score(completions, **kw):\n    return [1.0 for c in completions\n", "line 2: SyntaxError"),
    ("import json\nVALUE = json.loads('{')\n", "line 2: JSONDecodeError"),
])
def test_a_file_that_fails_to_load_names_the_file_and_line(tmp_path, source, message):
    path = tmp_path / "broken.py"
    path.write_text(source)
    with pytest.raises(UserError, match=f"reward file {path} fails to load \\({message}"):
        load_reward_functions([f"{path}:score"])


def test_a_file_may_import_its_neighbours(tmp_path):
    (tmp_path / "helpers.py").write_text("def half(x):\n    return x / 2\n")
    (tmp_path / "rewards.py").write_text("from helpers import half\n\n"
                                         "def score(completions, **kw):\n    return [half(len(c)) for c in completions]\n")
    fn = load_reward_functions([f"{tmp_path}/rewards.py:score"])[0]
    assert fn.label == "rewards:score" and fn.fn(completions=["abcd"]) == [2.0]


# ---- calling them -------------------------------------------------------------------------------

def samples_of(rows: list[dict], texts: list[str], chat: bool = False) -> Samples:
    """Samples as sample_responses makes them: each text's token ids (one per character, then a
    stop token 2) right-padded with 0."""
    width = max(len(t) for t in texts) + 1
    responses = torch.zeros(len(texts), width, dtype=torch.long)
    mask = torch.zeros_like(responses)
    for i, t in enumerate(texts):
        ids = [ord(ch) % 200 + 3 for ch in t] + [2]
        responses[i, :len(ids)], mask[i, :len(ids)] = torch.tensor(ids), 1
    prompts = [Prompt([1, 5], r.get("answer"), r, [{"role": "user", "content": r["prompt"]}] if chat else r["prompt"])
               for r in rows]
    ids = torch.cat([torch.ones(len(texts), 2, dtype=torch.long), responses], 1)
    return Samples(ids, torch.cat([torch.ones_like(ids[:, :2]), mask], 1), 2, mask, texts,
                   [p.answer for p in prompts], prompts)


ROWS = [{"id": f"q{i}", "prompt": f"What is {a} plus {b}?", "answer": None if i == 3 else str(a + b),
         "source": "sums", "text": f"What is {a} plus {b}?"}
        for i, (a, b) in enumerate([(2, 3), (40, 2), (3, 4), (1, 1), (5, 5), (6, 1)])]
TEXTS = ["5", "It is 42, since 40 plus 2 is", "it is 8", "2", "10 and more words than needed", "seven: 7"]


def test_a_reward_that_raises_on_one_response_scores_it_none_and_names_file_line_and_row(capsys):
    rewards = load_reward_functions([f"{REWARD_FILE}:fails_on_sevens", "verify"])
    call = reward_call(samples_of(ROWS, TEXTS))
    columns, metrics = score_rewards(rewards, call)
    assert columns[0][:5] == [0.5] * 5 and math.isnan(columns[0][5])  # only the response with a 7
    assert metrics["reward_none/trl_style_rewards:fails_on_sevens"] == 1.0
    assert metrics["reward/trl_style_rewards:fails_on_sevens"] == 0.5
    warning = capsys.readouterr().err
    assert f"raised on row 'q5': {REWARD_FILE} line 41: ValueError: cannot judge a seven" in warning
    # verify: row q3 has no answer, so None there
    assert math.isnan(columns[1][3]) and columns[1][:3] == [1.0, 0.0, 0.0]
    assert metrics["reward_none/verify"] == 1.0


def test_rewards_combine_as_trls_nansum_and_a_response_none_scored_is_nan():
    assert combine([[1.0, math.nan, math.nan], [0.5, 2.0, math.nan]], [2.0, 0.5]) == pytest.approx(
        [2.25, 1.0, math.nan], nan_ok=True)


def test_a_reward_returning_the_wrong_count_is_named(tmp_path):
    path = tmp_path / "short.py"
    path.write_text("def score(completions, **kw):\n    return [1.0]\n")
    rewards = load_reward_functions([f"{path}:score"])
    with pytest.raises(UserError, match=f"reward {path}:score returned 1 rewards for 6 completions"):
        score_rewards(rewards, reward_call(samples_of(ROWS, TEXTS)))


def test_the_scorer_logs_each_rewards_mean_and_nones_and_what_the_functions_log(tmp_path):
    path = tmp_path / "logs.py"
    path.write_text("def score(completions, log_metric, trainer_state, **kw):\n"
                    "    log_metric('my_metric', trainer_state.global_step)\n"
                    "    return [None if c == '2' else 1.0 for c in completions]\n")
    scorer = RewardScorer(load_reward_functions([f"{path}:score"]), [3.0])
    scorer.state = trainer_state(7, 100)
    scores = scorer(samples_of(ROWS, TEXTS))
    assert scores.tolist()[:3] == [3.0, 3.0, 3.0] and math.isnan(scores[3])
    assert scorer.metrics["my_metric"] == 7.0 and scorer.metrics["reward_unscorable"] == 1.0
    assert scorer.metrics["reward_none/logs:score"] == 1.0


class FixedRewardModel(torch.nn.Module):
    def forward(self, input_ids, attention_mask):
        return torch.tensor([0.5, -1.0, 2.0])


@pytest.mark.parametrize("partial, want", [(False, [2.5, -1.0, 4.0]), (True, [2.5, 0.0, 4.0])])
def test_mix_adds_the_weighted_verifiable_reward_to_the_reward_models_score(partial, want):
    samples = Samples(torch.zeros(3, 4, dtype=torch.long), torch.ones(3, 4, dtype=torch.long), 2,
                      torch.ones(3, 2, dtype=torch.long), ["42", "41", " 42 "], ["42", "42", "42"])
    names = reward_names("mix", has_reward_model=True)
    scorer = RewardScorer(load_reward_functions(names, partial_credit=partial),
                          reward_weights(names, "mix", None, verify_weight=2.0), FixedRewardModel())
    assert scorer(samples).tolist() == want  # "41" against 42: half right with partial credit


def test_verify_gives_partial_credit_when_asked():
    samples = Samples(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long), 1,
                      torch.ones(2, 2, dtype=torch.long), ["c b x", "c b a"], ["c b a", "c b a"])
    for partial, want in ((False, [0.0, 1.0]), (True, [0.8, 1.0])):
        scorer = RewardScorer(load_reward_functions(["verify"], partial_credit=partial), [1.0])
        assert scorer(samples).tolist() == pytest.approx(want)


# ---- the built-ins ------------------------------------------------------------------------------

def test_the_default_format_is_trls_think_format_reward():
    from trl.rewards import think_format_reward

    texts = ["<think>\nI add.\n</think>\n42", "<think>x</think>", "42", "<think>a<think>b</think>c",
             "I think <think>a</think> b", "<think>\nno end", "<think></think>\n\n", "<think>a</think>\n<think>b</think>"]
    ours = format_reward_of(None)(completions=texts)
    assert ours == think_format_reward([[{"content": t}] for t in texts])
    assert ours == format_reward_of(None)(completions=[[{"role": "assistant", "content": t}] for t in texts])
    assert sum(ours) == 3


def test_a_format_regex_matches_the_whole_completion():
    boxed = format_reward_of(r".*\\boxed\{[^}]+\}\s*")
    assert boxed(completions=["so \\boxed{42}", "\\boxed{} no", "\\boxed{4}\nthen more"]) == [1.0, 0.0, 0.0]
    with pytest.raises(ConfigError, match="reward_format"):
        format_reward_of("(")


@pytest.mark.parametrize("name, module", [("math", "llmkit.rewards.math"), ("code", "llmkit.rewards.code")])
def test_the_verifiers_are_imported_when_named(name, module):
    import importlib

    reward, = load_reward_functions([name])
    assert callable(reward.fn) and reward.label == name
    assert reward.fn is getattr(importlib.import_module(module), f"{name}_reward")


# ---- the same reward file in TRL's GRPOTrainer ----------------------------------------------------

@pytest.fixture(scope="module")
def trl_trainer(tmp_path_factory):
    """TRL's GRPOTrainer given the file's functions, as a TRL user passes them."""
    import importlib.util

    import transformers
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from tests.train.test_trl_parity import tiny_llama, trainer_args
    from tests.tokenizers.test_tokenizer_json import GENERATION_TEMPLATE, QWEN_SPECIALS, save_folder, train_bpe

    spec = importlib.util.spec_from_file_location("trl_style_rewards", REWARD_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    folder = save_folder(tmp_path_factory.mktemp("tokenizer"), train_bpe(QWEN_SPECIALS), GENERATION_TEMPLATE,
                         eos_token="<|im_end|>", pad_token="<|endoftext|>")
    args = trainer_args(GRPOConfig, tmp_path_factory, per_device_train_batch_size=2, num_generations=2,
                        max_completion_length=8, reward_weights=WEIGHTS)
    return GRPOTrainer(model=tiny_llama(5), reward_funcs=[getattr(module, f) for f in FUNCTIONS], args=args,
                       train_dataset=Dataset.from_list(ROWS),
                       processing_class=transformers.AutoTokenizer.from_pretrained(folder))


@pytest.mark.parametrize("chat", [False, True], ids=["standard", "conversational"])
def test_a_trl_reward_file_gives_the_same_rewards_in_trl_and_llmkit(trl_trainer, chat):
    """GRPOTrainer._calculate_rewards (how TRL calls its reward functions: prompts, completions,
    completion_ids, the rows' other columns, trainer_state…) and llmkit's scorer, on the same rows
    and completions: every function's reward (None as NaN) and their weighted sum."""
    samples = samples_of(ROWS, TEXTS, chat)
    call = reward_call(samples)
    inputs = [{k: v for k, v in row.items()} for row in ROWS]
    prompts = call.prompts
    if chat:
        assert prompts[0] == [{"role": "user", "content": ROWS[0]["prompt"]}]
        assert call.completions[0] == [{"role": "assistant", "content": TEXTS[0]}]
    for row, prompt in zip(inputs, prompts):
        row["prompt"] = prompt
    theirs = trl_trainer._calculate_rewards(inputs, prompts, call.completions, call.completion_ids)

    names = [f"{REWARD_FILE}:{f}" for f in FUNCTIONS]
    rewards = load_reward_functions(names)
    scorer = RewardScorer(rewards, WEIGHTS)
    scorer.state = trainer_state(trl_trainer.state.global_step, None)
    ours = scorer(samples)
    columns, _ = score_rewards(rewards, reward_call(samples, scorer.state))
    torch.testing.assert_close(torch.tensor(columns).T, theirs, equal_nan=True)
    their_total = (theirs * torch.tensor(WEIGHTS)).nansum(1)  # TRL's sum_then_normalize
    their_total[theirs.isnan().all(1)] = torch.nan
    torch.testing.assert_close(ours, their_total, equal_nan=True)
    assert math.isnan(theirs[3, 0]) and not theirs[:, 1:].isnan().any()  # q3's None, the rest scored
