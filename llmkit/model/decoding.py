"""Decoding with a KV cache: sampling one token (temperature, top-k, top-p, greedy), generating
continuations of a batch of left-padded prompts, and the reply tokens of chat prompts.

Callers must know: `generate` and `generate_replies` use the model as it is (call `.eval()` first
for deterministic replies); `Transformer.hidden_states(..., kv_cache=KVCache(...))` fills the cache
and reads it back, so a step after the prompt costs one token's forward."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from llmkit.errors import ConfigError
from llmkit.model import decode_step
from llmkit.model.packed_linear import packed_linears
from llmkit.model.rope import LENGTH_DEPENDENT

if TYPE_CHECKING:
    from llmkit.model.gated_deltanet import RecurrentState
    from llmkit.model.transformer import Transformer
    from llmkit.model.config import ModelConfig


class KVCache:
    """Keys and values of every attention layer for up to max_len tokens; the first `length` are filled.
    Storage is allocated on first use with the keys' dtype and device (so it follows autocast).
    A linear-attention layer (`llmkit.model.gated_deltanet`) keeps its `RecurrentState` in `recurrent`
    instead: a fixed size, whatever the length."""

    def __init__(self, cfg: ModelConfig, batch_size: int, max_len: int):
        self.shape = (batch_size, cfg.n_kv_heads, max_len, cfg.head_dim)
        self.k: list[torch.Tensor | None] = [None] * cfg.n_layers
        self.v: list[torch.Tensor | None] = [None] * cfg.n_layers
        self.recurrent: list[RecurrentState | None] = [None] * cfg.n_layers
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

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep (or repeat) the batch rows `rows` of every layer, in that order, up to `length`:
        finished rows leave the batch, a prompt prefilled once fans out to its copies."""
        self.shape = (len(rows), *self.shape[1:])
        for store in (self.k, self.v):
            for layer, t in enumerate(store):
                if t is not None:
                    kept = t.new_empty(self.shape)
                    kept[:, :, :self.length] = t[rows, :, :self.length]
                    store[layer] = kept
        self.recurrent = [None if state is None else state.select_rows(rows) for state in self.recurrent]


def sample_next_token(logits, temperature=1.0, top_k=None, top_p=None, greedy=False, generator=None,
                      rows=None, batch_size=None):
    """One token id per row from logits [B, V].

    A row samples by inverse CDF: one uniform number, found in the row's cumulative probabilities.
    `rows` (the batch rows these logits are, of `batch_size`) keep the random stream of a full batch
    when finished rows have left it: every step draws the numbers of all `batch_size` rows, so a row
    samples the same token whether or not the others are still generating."""
    if greedy or temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() if temperature == 1 else logits.float() / temperature
    if top_k is not None:
        kth_best = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth_best, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the better ones already reach top_p (the best token always stays)
        sorted_logits = sorted_logits.masked_fill(probs.cumsum(-1) - probs >= top_p, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, sorted_idx, sorted_logits)
    # one number per row rather than torch.multinomial's exponential noise over the whole
    # vocabulary (16 x 49k draws took a fifth of a SmolLM2 decoding step); float64 sums keep a
    # token's share of [0, 1) its probability to ~1e-16
    cdf = logits.softmax(-1).double().cumsum(-1)
    uniform = torch.rand(batch_size or len(cdf), 1, generator=generator, dtype=cdf.dtype, device=cdf.device)
    if rows is not None:
        uniform = uniform[rows]
    # the first token whose cumulative probability exceeds u x total: never one of probability 0
    return torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True).squeeze(-1).clamp_(max=cdf.shape[-1] - 1)


def with_packed_linears(decode):
    """`decode(model, ...)` with the model's linear layers packed for its many small products."""

    @functools.wraps(decode)
    def wrapper(model, *args, **kwargs):
        with packed_linears(model):
            return decode(model, *args, **kwargs)

    return wrapper


@with_packed_linears
@torch.no_grad()
def generate(model: Transformer, input_ids, max_new_tokens: int, temperature=1.0, top_k=None, top_p=None,
             greedy=False, eos_id=None, attention_mask=None, generator=None):
    """Prompt plus up to max_new_tokens sampled tokens, [B, T + n], using a KV cache.

    A batch of prompts of different lengths is left-padded with attention_mask (1 = real). A row that
    produced eos_id keeps emitting eos_id; generation stops early once every row has.

    The work is that of the rows still generating: identical prompts (a GRPO group) are prefilled
    once, and a row that produced eos_id leaves the batch (its cache rows with it). Sampling draws
    the random numbers of the whole batch at every step, so a seed gives the same tokens as when
    every row computed to the end."""
    B, T = input_ids.shape
    device = input_ids.device
    if attention_mask is not None and bool(attention_mask.all()):
        attention_mask = None  # no padding: take the unmasked fast path
    tokens = input_ids.new_full((B, T + max_new_tokens), eos_id if eos_id is not None else 0)
    tokens[:, :T] = input_ids
    # the prompts' cache slots may be laid out anew (see prefill): their mask comes back with them
    hidden, cache, attention_mask = prefill(model, input_ids, attention_mask, T + max_new_tokens)
    if attention_mask is not None:
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(B, max_new_tokens)], dim=1)
        position_ids = attention_mask[:, :T].long().sum(-1, keepdim=True) - 1
    rows = torch.arange(B, device=device)  # the original row of each row still generating
    direct = decode_step.plan(model, hidden)  # the modules' steps without their calls, where it can
    done = 0
    for step in range(max_new_tokens):
        next_token = sample_next_token(model.lm_head(hidden), temperature, top_k, top_p, greedy, generator,
                                       rows=rows, batch_size=B)
        tokens[rows, T + step] = next_token
        done = step + 1
        if step == max_new_tokens - 1:
            break
        if eos_id is not None:
            going = next_token != eos_id
            if not bool(going.all()):
                if not bool(going.any()):
                    break
                keep = going.nonzero().squeeze(1)
                rows, next_token = rows[keep], next_token[keep]
                cache.select_rows(keep)
                if attention_mask is not None:
                    attention_mask, position_ids = attention_mask[keep], position_ids[keep]
        if attention_mask is not None:
            position_ids = position_ids + 1
        step_ids, step_positions = next_token[:, None], position_ids if attention_mask is not None else None
        step_mask = None if attention_mask is None else attention_mask[:, :T + step + 1]
        hidden = (model.hidden_states(step_ids, step_positions, kv_cache=cache, attention_mask=step_mask)
                  if direct is None else
                  decode_step.step_hidden(model, direct, step_ids, step_positions, cache, step_mask))[:, -1]
    return tokens[:, :T + done]


def prefill(model: Transformer, input_ids, attention_mask, max_len: int):
    """(the hidden state of each row's last prompt token [B, hidden], a KVCache holding every row's
    prompt, the attention mask of the cache's prompt slots [B, T] or None when all are real).

    Each distinct prompt is computed once (its cache rows then copied to the rows that repeat it),
    and the tokens every prompt starts with (a chat template's system turn) once for all: the cache
    then holds that prefix first and each row's left-padded rest after it. Attention sees the same
    keys at the same positions either way; only a sliding window reads slot distances, and a
    linear-attention layer's state would decay over the padding between prefix and rest, and RoPE
    whose frequencies follow the forward's length (dynamic, longrope) must see the whole prompt in one
    forward, as transformers does, so those models keep the plain layout."""
    mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
    unique, first_of, inverse = distinct_rows(torch.cat([input_ids, mask], 1))
    ids, mask = input_ids[first_of], mask[first_of]
    B, T = ids.shape
    rows = [r[T - n:] for r, n in zip(ids.tolist(), mask.sum(-1).tolist())]
    scaling = (model.config.rope_scaling or {}).get("rope_type")
    plain = (model.config.sliding_window is not None or model.config.layer_types is not None
             or scaling in LENGTH_DEPENDENT)
    shared = shared_prefix_length(rows) if B > 1 and not plain else 0
    cache = KVCache(model.config, 1 if shared else B, max_len)
    if shared:
        model.hidden_states(ids.new_tensor([rows[0][:shared]]), kv_cache=cache)
        cache.select_rows(torch.zeros(B, dtype=torch.long, device=ids.device))
        rest, rest_mask = left_pad([r[shared:] for r in rows], pad_id=0)
        rest, rest_mask = rest.to(ids.device), rest_mask.to(ids.device)
        mask = torch.cat([mask.new_ones(B, shared), rest_mask], 1)
        position_ids = (shared + rest_mask.cumsum(-1) - 1).clamp(min=0)
        hidden = model.hidden_states(rest, position_ids, kv_cache=cache, attention_mask=mask)[:, -1]
    elif scaling not in LENGTH_DEPENDENT and len(groups := length_groups(mask.sum(-1).tolist())) > 1:
        # prompts of very different lengths
        hidden = torch.empty(B, model.config.hidden_size, device=ids.device)
        for group in groups:
            rows = torch.tensor(group, dtype=torch.long, device=ids.device)
            width = int(mask[rows].sum(-1).max())  # the group's longest prompt: the padding before it dropped
            hidden[rows] = prefill_rows(model, ids[rows, T - width:], mask[rows, T - width:], cache, rows, T)
        cache.length = T
    else:
        padded = not bool(mask.all())
        position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0) if padded else None
        hidden = model.hidden_states(ids, position_ids, kv_cache=cache,
                                     attention_mask=mask if padded else None)[:, -1]
    if not unique:
        cache.select_rows(inverse)
        hidden, mask = hidden[inverse], mask[inverse]
    return hidden, cache, None if bool(mask.all()) else mask


def length_groups(lengths: list[int], slack: float = 1.25) -> list[list[int]]:
    """The rows (indices) in groups of similar prompt length, the shortest first: a group's rows x
    its longest prompt stay within `slack` x its tokens, so left padding costs at most a quarter
    more positions than the prompts hold (16 prompts of 19-201 tokens: 2,082 instead of 3,216)."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        if groups and lengths[i] * (len(groups[-1]) + 1) <= slack * (sum(lengths[j] for j in groups[-1]) + lengths[i]):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def prefill_rows(model: Transformer, ids, mask, cache: KVCache, rows, T: int):
    """Prefill the left-padded prompts ids [n, W] (mask [n, W]) on their own, then place their keys
    and values in `cache`'s rows `rows` at its prompt slots T - W .. T (the slots before are these
    rows' padding, masked) and their recurrent states; the hidden state of each row's last token."""
    padded = not bool(mask.all())
    position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0) if padded else None
    own = KVCache(model.config, len(rows), ids.shape[1])
    hidden = model.hidden_states(ids, position_ids, kv_cache=own, attention_mask=mask if padded else None)[:, -1]
    for store, mine in ((cache.k, own.k), (cache.v, own.v)):
        for layer, t in enumerate(mine):
            if t is not None:
                if store[layer] is None:
                    store[layer] = t.new_zeros(cache.shape)
                store[layer][rows, :, T - ids.shape[1]:T] = t
    for layer, state in enumerate(own.recurrent):
        if state is not None:
            cache.recurrent[layer] = state.placed_in(cache.recurrent[layer], rows, cache.shape[0])
    return hidden


def shared_prefix_length(rows: list[list[int]]) -> int:
    """How many first tokens every row has in common, leaving each row at least one of its own."""
    n, limit = 0, min(map(len, rows)) - 1
    while n < limit and all(r[n] == rows[0][n] for r in rows):
        n += 1
    return n


def distinct_rows(rows: torch.Tensor) -> tuple[bool, torch.Tensor, torch.Tensor]:
    """(whether every row is distinct, the index of the first row of each distinct value, the
    distinct value of each row as an index into those)."""
    seen: dict[tuple, int] = {}
    inverse = [seen.setdefault(tuple(r), len(seen)) for r in rows.tolist()]
    first = {}
    for i, d in enumerate(inverse):
        first.setdefault(d, i)
    as_tensor = functools.partial(torch.tensor, dtype=torch.long, device=rows.device)
    return len(seen) == len(inverse), as_tensor(list(first.values())), as_tensor(inverse)


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


@with_packed_linears
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
