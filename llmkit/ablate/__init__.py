"""`llmkit ablate`: an experiment (a stage or a chain, a baseline, variants, seeds, metrics) run
through the normal stages, with each variant's mean and its difference to the baseline given with
t-intervals over seeds."""
