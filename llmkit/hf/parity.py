"""The parity of an export with transformers: load the folder with transformers and compare its
logits, greedy tokens and tokenizer with llmkit's on a probe batch.

Two inputs encode differently in transformers than in llmkit (both documented in the record):
a literal "▁" (U+2581), which transformers reads as a space (llmkit encodes its UTF-8 bytes), and
control-token text such as "<s>" typed in a prompt, which transformers turns into the control token.
A jieba tokenizer's Chinese word segmentation has no transformers equivalent either.

`cfg` below is the export's ExportConfig (probe_tokens, probe_new_tokens, tolerance)."""

from __future__ import annotations

from pathlib import Path

# English, Chinese, code with indentation, emoji, digits: what the exported tokenizer must agree on
PROBE_TEXTS = [
    "The quick brown fox jumps over the lazy dog. It was 3:45 pm on 2024-01-01.",
    "大语言模型的训练需要大量的中文和英文数据，以及仔细的清洗。",
    "def add(a, b):\n    if a > 0:\n\treturn a + b  # tabs and  spaces\n    return 0\n",
    "Emoji 😀🎉 👩‍👩‍👧 and digits 3.14159 1234567890 ½.",
    "  leading spaces, trailing spaces  \n\nblank lines\r\n",
]
PROBE_CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2=? 用中文回答"},
              {"role": "assistant", "content": "四 (4) 😀"}]
TOKENIZER_NOTES = ("transformers encodes a literal '\u2581' (U+2581) as a space and control-token text "
                   "('<s>', '</s>', '<pad>', '<unk>') typed in a prompt as the control token; llmkit encodes "
                   "both as plain text")


def probe_parity(out_dir: Path, model, tokenizer, cfg) -> dict:
    """Load `out_dir` with transformers and compare it with llmkit's model and tokenizer; empty
    when transformers is not installed."""
    try:
        import transformers
    except ImportError:
        print("export: transformers is not installed; parity with transformers was not measured")
        return {}
    hf_model, hf_tokenizer = load_transformers(out_dir)
    return {**compare_with_transformers(model, tokenizer, hf_model, hf_tokenizer, cfg),
            "transformers_version": transformers.__version__}


def compare_with_transformers(model, tokenizer, hf_model, hf_tokenizer, cfg) -> dict:
    """Largest logit difference on the probe batch, greedy-token and tokenizer agreement."""
    import torch

    mismatched = [t for t in PROBE_TEXTS if hf_tokenizer.encode(t, add_special_tokens=False) != tokenizer.encode(t)
                  or hf_tokenizer.decode(tokenizer.encode(t)) != tokenizer.decode(tokenizer.encode(t))]
    chat_equal = None  # a base model's tokenizer may have no chat template: nothing to compare
    if tokenizer.chat_template is not None:
        chat_ids = _as_ids(hf_tokenizer.apply_chat_template(PROBE_CHAT, add_generation_prompt=True, tokenize=True))
        chat_equal = chat_ids == tokenizer.encode_chat(PROBE_CHAT, add_generation_prompt=True)[0]

    inputs = probe_batch(tokenizer, model.config, cfg)
    with torch.no_grad():
        diff = (model(inputs) - hf_model(inputs).logits.float()).abs().max().item()
    ours = _greedy_llmkit(model, inputs, cfg.probe_new_tokens)
    theirs = _greedy_transformers(hf_model, inputs, cfg.probe_new_tokens)
    greedy_equal = ours == theirs
    if diff > cfg.tolerance or not greedy_equal:
        print(f"warning: export parity: max |logit diff| {diff:.2e} (tolerance {cfg.tolerance:.0e}), "
              f"greedy tokens equal: {greedy_equal}")
    if mismatched or chat_equal is False:
        print(f"warning: the exported tokenizer encodes {len(mismatched)} of {len(PROBE_TEXTS)} probe texts "
              f"{'and the chat ' if chat_equal is False else ''}differently from llmkit's")
    return {"max_abs_logit_diff": diff, "greedy_tokens_equal": greedy_equal,
            "tokenizer_identical": not mismatched and chat_equal is not False,
            "probe": {"rows": inputs.shape[0], "tokens": inputs.shape[1], "new_tokens": cfg.probe_new_tokens,
                      "texts": len(PROBE_TEXTS), "texts_encoded_differently": mismatched,
                      "chat_template_equal": chat_equal, "tolerance": cfg.tolerance}}


def load_transformers(folder: Path):
    """(AutoModelForCausalLM in fp32, eval mode; AutoTokenizer) of a transformers folder, offline."""
    import torch
    import transformers

    dtype_key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True,
                                                              **{dtype_key: torch.float32})
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return model.eval(), tokenizer


def probe_batch(tokenizer, model_config, cfg):
    """[2, T]: the document start + the probe texts, and random ids that reach every part of the
    vocabulary."""
    import torch

    length = max(2, min(cfg.probe_tokens, model_config.max_seq_len - cfg.probe_new_tokens))
    text_ids = tokenizer.document_start_ids() + [i for t in PROBE_TEXTS for i in tokenizer.encode(t)]
    text_ids = (text_ids * (length // len(text_ids) + 1))[:length]
    generator = torch.Generator().manual_seed(0)
    random_ids = torch.randint(0, model_config.vocab_size, (length,), generator=generator)
    return torch.stack([torch.tensor(text_ids), random_ids])


def _greedy_llmkit(model, inputs, n: int) -> list[list[int]]:
    from llmkit.model.decoding import generate

    return generate(model, inputs, n, greedy=True)[:, inputs.shape[1]:].tolist()


def _greedy_transformers(hf_model, inputs, n: int) -> list[list[int]]:
    """n greedy tokens through transformers' own KV cache. A plain loop, not generate(): that one
    applies the exported generation_config (its eos ids), which llmkit's probe does not stop at."""
    import torch

    cache = _cache_name(hf_model)
    tokens = []
    with torch.no_grad():
        out = hf_model(inputs, use_cache=True)
        for _ in range(n):
            tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
            out = hf_model(tokens[-1], use_cache=True, **{cache: getattr(out, cache)})
    return torch.cat(tokens, 1).tolist()


def _cache_name(hf_model) -> str:
    """What transformers calls the KV cache, in forward's arguments and in its outputs: `cache`
    since transformers 5.2x (`past_key_values` warns, and goes in 5.40), `past_key_values` before."""
    import inspect

    return "cache" if "cache" in inspect.signature(hf_model.forward).parameters else "past_key_values"


def _as_ids(encoded) -> list[int]:
    if isinstance(encoded, dict) or hasattr(encoded, "keys"):
        encoded = encoded["input_ids"]
    return list(encoded)
