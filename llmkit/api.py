"""The Python API: load a checkpoint, generate text with it.

    import llmkit
    import torch

    model, tok = llmkit.load("sft")  # a run of ./workspace ($LLMKIT_WORKSPACE), or a path
    logits = model(torch.tensor([tok.encode("Hello")]))  # [batch, seq, vocab], float32
    print(llmkit.generate(model, tok, ["What is 12+34?"], greedy=True, max_new_tokens=16))

`load` is for causal language models; a reward-model checkpoint (config.json marked by `llmkit rm`)
loads with `llmkit.checkpoints.loading.load_reward_model`. Weights are read from safetensors only.

This module is the public front; the work is done in `llmkit.checkpoints.loading` (finding and loading
checkpoints) and `llmkit.generation` (prompts, sampling, `llmkit generate`).
"""

from llmkit.generation import GenerateConfig, generate, generate_texts
from llmkit.checkpoints.loading import load, load_model, load_tokenizer

__all__ = ["load", "generate", "GenerateConfig", "generate_texts", "load_model", "load_tokenizer"]
