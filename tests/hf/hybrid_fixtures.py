"""Tiny random Qwen3.5 and SmolLM3 folders built by transformers' own config and model classes, with
byte-level BPE tokenizers, for the GGUF export tests (tests/hf/test_gguf_qwen35.py and the llama.cpp
test). Their vectors are moved off their initial values; with `texts`, the model is trained until it
continues them from memory: a random model's next-token distribution is so flat that over 24 greedy
steps most prompts meet a near tie that f16 or q8_0 rounding may decide the other way, while a model
reciting what it learnt decides by a margin, as a trained model mostly does."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from tests.tokenizers.test_tokenizer_json import QWEN25_TEMPLATE, QWEN_SPECIALS, save_folder, train_bpe
from tests.hf.test_smollm3 import SPECIALS as SMOLLM3_SPECIALS, TEMPLATE as SMOLLM3_TEMPLATE

LINEAR, FULL = "linear_attention", "full_attention"
# two value heads per key head (the reorder llama.cpp needs), key and value heads of one width (as
# llama.cpp's qwen35 graph needs), a quarter of each attention head rotated
QWEN35_SHAPE = dict(vocab_size=832, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, max_position_embeddings=512, linear_num_key_heads=2,
                    linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                    linear_conv_kernel_dim=4, tie_word_embeddings=False,
                    layer_types=[LINEAR, LINEAR, LINEAR, FULL], num_hidden_layers=4)
SMOLLM3_SHAPE = dict(vocab_size=832, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                     pad_token_id=None, bos_token_id=None, eos_token_id=None)  # every 4th layer without RoPE


def widened(model, std: float, seed: int):
    """Matrices redrawn with `std`, vectors (norms, decay rates, dt_bias) moved off their initial
    values (so that a detail of them written wrong would show)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and "conv1d" not in name:
                p.copy_(torch.randn(p.shape, generator=generator) * std)
            else:
                p.add_(0.3 * torch.randn(p.shape, generator=generator))
    return model.float().eval()


LEARNT_TOKENS = 60  # of each text: a test's prompt and its reply stay inside them


def memorized(hf, tokenizer, texts: list[str], steps: int = 100, lr: float = 1e-2, length: int = LEARNT_TOKENS):
    """`hf` trained (next-token loss, Adam) on the first `length` tokens of each of `texts`, all in one batch."""
    batch = torch.tensor([tokenizer.encode(t).ids[:length] for t in texts])
    optimizer = torch.optim.Adam(hf.parameters(), lr=lr)
    hf.train()
    for _ in range(steps):
        hf(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return hf.eval()


def qwen35_tokenizer():
    """Qwen's BPE with Qwen3.5's pre-tokenizer regex (Qwen2's with marks in words)."""
    from tokenizers import Regex, pre_tokenizers

    from llmkit.hf.gguf_tokenizer import QWEN35_SPLIT

    tok = train_bpe(QWEN_SPECIALS)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return tok


def save_qwen35(folder: Path, texts: list[str] | None = None, seed: int = 0, std: float = 0.1,
                **change) -> Path:
    torch.manual_seed(seed)
    hf = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**{**QWEN35_SHAPE, **change}))
    tokenizer = qwen35_tokenizer()
    hf = widened(hf, std, seed)
    (memorized(hf, tokenizer, texts) if texts else hf).save_pretrained(folder)
    save_folder(folder, tokenizer, QWEN25_TEMPLATE, eos_token="<|im_end|>")
    return folder


def save_smollm3(folder: Path, texts: list[str] | None = None, seed: int = 0, std: float = 0.1) -> Path:
    torch.manual_seed(seed)
    hf = transformers.SmolLM3ForCausalLM(transformers.SmolLM3Config(**SMOLLM3_SHAPE))
    tokenizer = train_bpe(SMOLLM3_SPECIALS)
    hf = widened(hf, std, seed)
    (memorized(hf, tokenizer, texts) if texts else hf).save_pretrained(folder)
    save_folder(folder, tokenizer, SMOLLM3_TEMPLATE, eos_token="<|im_end|>", pad_token="<|end_of_text|>")
    return folder
