"""`llmkit dpo`: the shared training command body (llmkit.cli.training) with DPO's names."""
from llmkit.cli.training import POLICY, REF, held_out, training_command
from llmkit.stages import deferred

dpo = training_command(
    "dpo", deferred("llmkit.train.dpo:plan_dpo"), deferred("llmkit.train.dpo:run_dpo"),
    "Direct preference optimisation (sigmoid/ipo/cdpo/robust/reference_free; orpo/simpo without a reference model) on pairs (--in, default pref_train) -> `dpo`.",
    POLICY, REF, held_out("Held-out preference dataset, scored by exact match before/after"))
