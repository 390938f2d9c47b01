"""The stage framework every command stands on: context, config, recipes, workspace, locks, executor, progress, targets, compiled kernels."""
