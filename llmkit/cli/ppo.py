"""`llmkit ppo`: the shared training command body (llmkit.cli.training) with PPO's options."""
from llmkit.cli.training import Opt, held_out, training_command
from llmkit.stages import deferred

ppo = training_command(
    "ppo", deferred("llmkit.train.ppo:plan_ppo"), deferred("llmkit.train.ppo:run_ppo"),
    "PPO / GRPO / RLOO (--set algo=) of a policy on prompts (--in, default prompts_train), rewarded by --reward or exact match -> `ppo`.",
    Opt("--from", "Policy checkpoint run (or step folder) to start from, e.g. sft.", "policy", "sft"),
    Opt("--reward", "Reward-model run (`llmkit rm`); without it the reward is exact match against "
                    "each prompt's answer.", "reward_model"),
    held_out("Held-out prompt dataset for exact match before/after"))
