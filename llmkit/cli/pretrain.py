"""`llmkit pretrain`: the shared training command body (llmkit.cli.training)."""
from llmkit.cli.training import Opt, training_command
from llmkit.stages import deferred

pretrain = training_command(
    "pretrain", deferred("llmkit.train.pretrain:plan_pretrain"),
    deferred("llmkit.train.pretrain:run_pretrain"),
    "Pretrain a causal LM on token shards (--in, default tokens) -> checkpoint run `pretrain`.",
    Opt("--from", "Start from this checkpoint run (its latest step) or step folder: its weights "
                  "and architecture, with a fresh optimizer and schedule.", "from_"))
