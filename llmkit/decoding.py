"""Decoding with a KV cache: sampling one token (temperature, top-k, top-p, greedy), generating
continuations of a batch of left-padded prompts, and the reply tokens of chat prompts.

Callers must know: `generate` and `generate_replies` use the model as it is (call `.eval()` first
for deterministic replies); `Transformer.hidden_states(..., kv_cache=KVCache(...))` fills the cache
and reads it back, so a step after the prompt costs one token's forward."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from llmkit.errors import ConfigError

if TYPE_CHECKING:
    from llmkit.model import Transformer
    from llmkit.model_config import ModelConfig


class KVCache:
    """Keys and values of every layer for up to max_len tokens; the first `length` are filled.
    Storage is allocated on first use with the keys' dtype and device (so it follows autocast)."""

    def __init__(self, cfg: ModelConfig, batch_size: int, max_len: int):
        self.shape = (batch_size, cfg.n_kv_heads, max_len, cfg.head_dim)
        self.k: list[torch.Tensor | None] = [None] * cfg.n_layers
        self.v: list[torch.Tensor | None] = [None] * cfg.n_layers
        self.length = 0

    def update(self, layer: int, k, v):
        if self.k[layer] is None:
            self.k[layer] = k.new_zeros(self.shape)
            self.v[layer] = v.new_zeros(self.shape)
        end = self.length + k.shape[2]
        if end > self.shape[2]:
            raise ValueError(f"KV cache holds {self.shape[2]} tokens, {end} requested")
        self.k[layer][:, :, self.length:end] = k
        self.v[layer][:, :, self.length:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]


def sample_next_token(logits, temperature=1.0, top_k=None, top_p=None, greedy=False, generator=None):
    """One token id per row from logits [B, V]."""
    if greedy or temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth_best = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth_best, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the better ones already reach top_p (the best token always stays)
        sorted_logits = sorted_logits.masked_fill(probs.cumsum(-1) - probs >= top_p, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, sorted_idx, sorted_logits)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(model: Transformer, input_ids, max_new_tokens: int, temperature=1.0, top_k=None, top_p=None,
             greedy=False, eos_id=None, attention_mask=None, generator=None):
    """Prompt plus up to max_new_tokens sampled tokens, [B, T + n], using a KV cache.

    A batch of prompts of different lengths is left-padded with attention_mask (1 = real). A row that
    produced eos_id keeps emitting eos_id; generation stops early once every row has.
    """
    B, T = input_ids.shape
    device = input_ids.device
    if attention_mask is not None and bool(attention_mask.all()):
        attention_mask = None  # no padding: take the unmasked fast path
    cache = KVCache(model.config, B, T + max_new_tokens)
    position_ids = None if attention_mask is None else (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    tokens, finished = input_ids, torch.zeros(B, dtype=torch.bool, device=device)
    hidden = model.hidden_states(input_ids, position_ids, kv_cache=cache, attention_mask=attention_mask)
    for step in range(max_new_tokens):
        next_token = sample_next_token(model.lm_head(hidden[:, -1]), temperature, top_k, top_p, greedy, generator)
        if eos_id is not None:
            next_token = next_token.masked_fill(finished, eos_id)
            finished |= next_token == eos_id
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        if step == max_new_tokens - 1 or (eos_id is not None and bool(finished.all())):
            break
        if attention_mask is not None:
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(B, 1)], dim=1)
            position_ids = position_ids[:, -1:] + 1
        hidden = model.hidden_states(next_token[:, None], position_ids, kv_cache=cache,
                                     attention_mask=attention_mask)
    return tokens


def reply_text(tokenizer, ids: list[int], cut: bool) -> str:
    """The text of reply tokens. A reply `cut` at the token limit may end inside a character that
    the tokenizer spells in several tokens (byte-level BPE, byte fallback): the first bytes of it
    decode to U+FFFD, and are dropped rather than shown."""
    text = tokenizer.decode(ids)
    return text.rstrip(INCOMPLETE) if cut else text


INCOMPLETE = "\ufffd"  # what a decoder gives for bytes that are not (yet) a whole character


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (ids [N, P], attention mask [N, P]) padded on the left, as generation needs."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        if s:
            ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s):] = 1
    return ids, mask


@torch.no_grad()
def generate_replies(model: Transformer, prompts: list[list[int]], *, stop_ids: list[int], pad_id: int,
                     max_new_tokens: int, batch_size: int = 64, temperature: float = 0.0,
                     seed: int = 0) -> list[list[int]]:
    """Reply tokens for each prompt (greedy when temperature is 0), cut before the first stop id,
    in batches of similar length. Prompts are cut from the left so that prompt + reply fit in
    max_seq_len. The model is used as it is (call .eval() first for deterministic replies)."""
    limit = model.config.max_seq_len - max_new_tokens
    if limit < 1:
        raise ConfigError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in "
                          f"max_seq_len={model.config.max_seq_len}")
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed) if temperature > 0 else None
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # less padding
    replies: list[list[int]] = [[] for _ in prompts]
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        ids, mask = left_pad([prompts[i][-limit:] for i in rows], pad_id)
        out = generate(model, ids.to(device), max_new_tokens, temperature=temperature,
                       greedy=temperature == 0, eos_id=stop_ids[0], attention_mask=mask.to(device),
                       generator=generator)
        for r, i in enumerate(rows):
            reply = out[r, ids.shape[1]:].tolist()
            cut = min((reply.index(s) for s in stop_ids if s in reply), default=len(reply))
            replies[i] = reply[:cut]
    return replies
