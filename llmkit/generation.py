"""Generation (`llmkit generate`, `llmkit.generate`): complete prompts with a checkpoint.

Prompts are plain text (after the `</s>` a pretrained model saw before every document) or chats
(the chat template up to the assistant's turn); the tokens come from `llmkit.model.decoding.generate`
(KV cache, temperature / top-k / top-p sampling, seeded).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from llmkit.core.config import resolve_config
from llmkit.data.io import read_jsonl
from llmkit.errors import ConfigError, UserError
from llmkit.checkpoints.loading import load
from llmkit.model.decode_weights import DecodeConfig


@dataclass
class GenerateConfig:
    max_new_tokens: int = 128  # tokens generated per prompt at most
    temperature: float = 1.0  # softmax temperature; 0 means greedy
    top_k: int | None = None  # sample among the k likeliest tokens only; None = all
    top_p: float = 1.0  # sample among the likeliest tokens whose probabilities sum to top_p
    greedy: bool = False  # always take the likeliest token (temperature, top_k, top_p unused)
    seed: int = 0  # sampling seed: the same seed, prompts and batch_size give the same text
    chat: bool | None = None  # wrap each prompt as a user turn of the chat template; None: when the
    #                           checkpoint was trained on chats (an sft / dpo / ppo run, or an imported
    #                           model whose tokenizer has a chat template)
    batch_size: int = 8  # prompts generated together (left-padded)
    device: str = "auto"  # auto (cuda when available), cpu, cuda, cuda:N
    decode: DecodeConfig = field(default_factory=DecodeConfig)  # decode.weights=fp32|bf16|int8 (CPU)
    verify: bool = False  # greedy: decode.weights drafts, a float32 pass checks: float32's tokens, one prompt
    #                       at a time (llmkit.model.verified_decoding)

    def __post_init__(self):
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise ConfigError("generate max_new_tokens and batch_size must be >= 1")
        if self.temperature < 0:
            raise ConfigError(f"generate temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"generate top_k must be >= 1 or none, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"generate top_p must be in (0, 1], got {self.top_p}")
        if self.verify and not (self.greedy or self.temperature == 0):
            raise ConfigError("generate verify=true keeps float32's greedy tokens: set greedy=true (or "
                              "temperature=0); a sampled token has no float32 token to keep")


def generate_texts(model, tokenizer, prompts: list, cfg: GenerateConfig) -> list[dict]:
    """One record per prompt: `prompt`, `completion` (the text after the prompt, up to a stop
    token), `new_tokens`, `stopped` (a stop token ended it) and `prompt_truncated`.

    A prompt is a string (plain text, or a user turn when chat) or a list of chat messages; chat
    is `uses_chat_template(model, cfg)`. Prompts longer than max_seq_len - max_new_tokens keep
    their last tokens; a completion cut at max_new_tokens inside a character drops its part."""
    import torch

    from llmkit.model.decoding import generate, left_pad, reply_text
    from llmkit.model.verified_decoding import packed_for_decoding, verified_greedy

    room = model.config.max_seq_len - cfg.max_new_tokens
    if room < 1:
        raise ConfigError(f"generate max_new_tokens={cfg.max_new_tokens} leaves no room for a prompt in the "
                          f"model's max_seq_len={model.config.max_seq_len}; lower it")
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    template = uses_chat_template(model, cfg)
    chat = template or any(not isinstance(p, str) for p in prompts)
    stop_ids = set(tokenizer.stop_ids)
    eos_id = tokenizer.end_of_turn_id if chat else tokenizer.eos_id
    records = []
    with packed_for_decoding(model, cfg.decode.weights, cfg.verify) as verifier:  # once for every batch
        size = 1 if verifier is not None else cfg.batch_size
        for start in range(0, len(prompts), size):
            batch = prompts[start:start + size]
            encoded = [encode_prompt(tokenizer, p, template) for p in batch]
            ids, mask = left_pad([p[-room:] for p in encoded], tokenizer.pad_id)
            width = ids.shape[1]
            out = (verified_greedy(model, verifier, ids.to(device), cfg.max_new_tokens, eos_id)
                   if verifier is not None else
                   generate(model, ids.to(device), cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k,
                            top_p=cfg.top_p, greedy=cfg.greedy, eos_id=eos_id, attention_mask=mask.to(device),
                            generator=generator))
            for prompt, prompt_ids, new in zip(batch, encoded, out[:, width:].tolist()):
                end = next((i for i, t in enumerate(new) if t in stop_ids), None)
                completion = reply_text(tokenizer, new[:end], cut=end is None)
                records.append({"prompt": prompt, "completion": completion,
                                "new_tokens": len(new) if end is None else end + 1, "stopped": end is not None,
                                "prompt_truncated": len(prompt_ids) > width})
    return records


def uses_chat_template(model, cfg: GenerateConfig) -> bool:
    """cfg.chat, or when that is None `model.trained_on_chats` (set by `load`: an sft / dpo / ppo
    run, or an imported model whose tokenizer has a chat template, as llama.cpp and Ollama prompt
    a model file that carries one)."""
    return cfg.chat if cfg.chat is not None else getattr(model, "trained_on_chats", False)


def generate(model, tokenizer, prompts, **options):
    """The completions of `prompts` (a list of strings or chat message lists; one string gives one
    completion), each the text after its prompt up to a stop token. `options` are GenerateConfig's
    (max_new_tokens, temperature, top_k, top_p, greedy, seed, chat, batch_size, decode={"weights":
    "int8"}, verify); by default a model `load` read from an sft / dpo / ppo run is prompted through
    its chat template."""

    if "device" in options:
        raise ConfigError("generate runs where the model is: load it with llmkit.load(..., device=) or "
                          "move it with model.to(device)")
    cfg = resolve_config(GenerateConfig, options)
    records = generate_texts(model, tokenizer, [prompts] if isinstance(prompts, str) else list(prompts), cfg)
    completions = [r["completion"] for r in records]
    return completions[0] if isinstance(prompts, str) else completions


def encode_prompt(tokenizer, prompt, chat: bool) -> list[int]:
    """Token ids a generation starts from: the chat template up to the assistant's turn for a
    message list (or any prompt when `chat`), else the text after `Tokenizer.document_start_ids()`
    (`</s>`, what a pretrained model saw before every document)."""
    if not isinstance(prompt, str):
        return tokenizer.encode_chat(prompt, add_generation_prompt=True)[0]
    if chat:
        return tokenizer.encode_chat([{"role": "user", "content": prompt}], add_generation_prompt=True)[0]
    return tokenizer.document_start_ids() + tokenizer.encode(prompt)


def warn_if_empty(records: list[dict], chat: bool) -> None:
    """A warning on stderr when completions are empty (the model ended its reply at once), with
    the prompt format to try instead."""
    empty = [n for n, r in enumerate(records, 1) if not r["completion"].strip()]
    if not empty:
        return
    which = "every completion is" if len(empty) == len(records) else \
        f"{len(empty)} of {len(records)} completions (prompt {', '.join(map(str, empty[:5]))}) are"
    hint = ("the prompts went through the chat template; a model trained on plain text may do "
            "better with --set chat=false") if chat else \
        ("the prompts went in as plain text; an instruct or chat model answers through its chat "
         "template: --set chat=true")
    print(f"warning: {which} empty: the model ended its reply at once. {hint}", file=sys.stderr)


def read_prompts(path) -> list:
    """Prompts from a .jsonl file (each line an object with `prompt`, or `messages` for a chat)
    or any other text file (each non-empty line a prompt)."""

    path = Path(path)
    try:
        if path.suffix != ".jsonl":
            return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        records = list(read_jsonl(path))
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--prompts {path}: cannot read it ({e})") from None
    prompts = []
    for n, record in records:
        prompt = record.get("messages", record.get("prompt")) if isinstance(record, dict) else None
        if not isinstance(prompt, (str, list)):
            raise UserError(f"{path}:{n}: each line needs a `prompt` string or a `messages` list")
        prompts.append(prompt)
    return prompts


def run_generate(ctx, cfg: GenerateConfig, source: str, prompts: list, output=None) -> list[dict]:
    """`llmkit generate`: print a completion of every prompt (and write them to `output` as jsonl)."""
    import torch

    if not prompts:
        raise UserError("no prompts: give --prompt TEXT (repeatable) or --prompts FILE")
    device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer = load(source, device=device, workspace=ctx.workspace.root)
    if cfg.chat is None and model.trained_on_chats:
        print(f"{source} was trained on chats (an sft / dpo / ppo run, or an imported model whose "
              "tokenizer has a chat template): prompts go through the chat template (--set "
              "chat=false for plain text)", file=sys.stderr)
    records = generate_texts(model, tokenizer, prompts, cfg)
    for record in records:
        shown = record["prompt"] if isinstance(record["prompt"], str) else record["prompt"][-1]["content"]
        print(f">>> {shown}\n{record['completion']}\n")
    warn_if_empty(records, uses_chat_template(model, cfg) or any(not isinstance(p, str) for p in prompts))
    if output is not None:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        with open(output, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return records
