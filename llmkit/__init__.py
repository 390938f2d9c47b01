"""llmkit: from raw text to an aligned language model.

    model, tokenizer = llmkit.load("sft")  # a run of ./workspace ($LLMKIT_WORKSPACE), or a path
    llmkit.generate(model, tokenizer, ["What is 12+34?"], greedy=True)  # -> [completion]

Importing llmkit is light: torch loads on the first `load`.
"""

from llmkit.version import __version__

__all__ = ["__version__", "load", "generate"]


def load(name_or_path, device=None, workspace=None):
    """(model, tokenizer) of a checkpoint run or step folder; see `llmkit.api.load`."""
    from llmkit.api import load as _load

    return _load(name_or_path, device=device, workspace=workspace)


def generate(model, tokenizer, prompts, **options):
    """The completions of `prompts`; see `llmkit.api.generate`."""
    from llmkit.api import generate as _generate

    return _generate(model, tokenizer, prompts, **options)
