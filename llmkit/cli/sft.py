"""`llmkit sft`: the shared training command body (llmkit.cli.training) with SFT's options."""
from llmkit.cli.training import Opt, held_out, training_command
from llmkit.stages import deferred

sft = training_command(
    "sft", deferred("llmkit.train.sft:plan_sft"), deferred("llmkit.train.sft:run_sft"),
    "Supervised fine-tuning on chats (--in, default sft_train), loss on assistant turns -> `sft`.",
    Opt("--from", "Checkpoint run (or step folder) to fine-tune, e.g. pretrain.", "base", "pretrain"),
    held_out("Held-out SFT dataset scored by exact match before/after"))
