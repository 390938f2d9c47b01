"""`llmkit synth`: training data made by a model — Magpie instructions, answers, grounded
question-answer pairs, rephrased documents and judged preference pairs (llmkit.synth.stage)."""
