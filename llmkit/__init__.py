"""llmkit: from raw text to an aligned language model."""

__version__ = "0.1.0"


def load(path):
    """Load `(model, tokenizer)` from a checkpoint run (its `latest`) or a step folder."""
    from llmkit.api import load as _load

    return _load(path)
