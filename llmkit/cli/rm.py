"""`llmkit rm`: the shared training command body (llmkit.cli.training) with the reward model's
options."""
from llmkit.cli.training import Opt, held_out, training_command
from llmkit.stages import deferred

rm = training_command(
    "rm", deferred("llmkit.train.rm:plan_rm"), deferred("llmkit.train.rm:run_rm"),
    "Reward model on preference pairs (--in, default pref_train), Bradley-Terry loss -> `rm`.",
    Opt("--from", "Checkpoint run (or step folder) whose trunk the reward model starts from, "
                  "e.g. sft.", "base", "sft"),
    held_out("Held-out preference dataset for pairwise accuracy"))
