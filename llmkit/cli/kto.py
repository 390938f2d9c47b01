"""`llmkit kto`: the shared training command body (llmkit.cli.training) with KTO's names."""
from llmkit.cli.training import POLICY, REF, held_out, training_command
from llmkit.stages import deferred

kto = training_command(
    "kto", deferred("llmkit.train.kto:plan_kto"), deferred("llmkit.train.kto:run_kto"),
    "Kahneman-Tversky optimisation on unpaired feedback: prompt, completion, label true/false (--in, default feedback_train) -> `kto`.",
    POLICY, REF, held_out("Held-out feedback dataset; its desirable completions are scored by "
                          "exact match before/after"))
