"""Model merging: `llmkit merge` (stage.py) over the per-tensor methods of methods.py."""
