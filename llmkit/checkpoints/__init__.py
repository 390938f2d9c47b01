"""Checkpoints: the step-folder format, LoRA adapters and their files, loading a model from a run."""
