"""Greedy decoding that keeps float32's tokens at low-precision weights' speed (`llmkit generate
--set decode.weights=int8 --set verify=true`): self-speculative decoding.

At batch 1 a decoding step streams every weight once, so int8 weights (a quarter of float32's
bytes) decode several times faster — but their rounding moves near ties: on 20 held-out prompts
SmolLM2's 128 greedy tokens through int8 weights equalled float32's on 9, through bf16 on 16
(bench/results/2026-12-07-greedy-agreement.md; llama.cpp's own q8_0 on 7). Here the low-precision
copy drafts `DRAFT_TOKENS` tokens one step at a time, and one float32 pass over all of them (its
products read each weight once for the whole draft) checks them: the drafted tokens float32 would
have chosen are kept, float32's own token replaces the first one it would not (or follows the last,
when it would have chosen them all), and the KV cache is cut back to the tokens kept. The output
is float32's greedy tokens whatever the draft chose; the draft only sets how many a float32 pass
gives (all of them, bar the rare parting). Leviathan et al. 2023 ("Fast Inference from
Transformers via Speculative Decoding") with the model's own rounded copy as the draft.

The float32 passes go through `verifier`, a second module tree over the model's own tensors
(`float32_twin`): packing lives on the modules, so the twin keeps float32 panels while the model
holds its low-precision copies (`decoding_weights`), at no cost in weights. Batch 1, and models
whose cache can be cut back: attention layers only (a linear-attention layer's recurrent state
cannot be rewound).
"""

from __future__ import annotations

import contextlib
import copy

import torch
from torch import nn

from llmkit.errors import ConfigError
from llmkit.model import decode_step
from llmkit.model.decode_weights import CONVERTED, decoding_weights, effective_weights
from llmkit.model.decoding import KVCache
from llmkit.model.packed_linear import PACKED, PACKED_FEW, PACKED_GROUPS, PACKED_T, packed_linears

DRAFT_TOKENS = 16  # drafted per float32 pass (SmolLM2 at 1 thread: an int8 step 10 ms, a float32 pass
#                    over 17 tokens 56 ms against 25 for one)
PACKING = (PACKED, PACKED_T, PACKED_FEW, PACKED_GROUPS, "forward")  # what packing sets on a module


def float32_twin(model: nn.Module) -> nn.Module:
    """A second module tree over `model`'s own parameters and buffers (no weight copied), without
    the model's packing (it lives in the modules' attributes), to be packed apart from it."""
    twin = copy.copy(model)  # a new object whose __dict__ is a copy of the model's
    for name in [n for n in vars(twin) if n in PACKING or n.startswith(CONVERTED)]:
        delattr(twin, name)
    twin._parameters, twin._buffers = dict(model._parameters), dict(model._buffers)
    twin._modules = {name: float32_twin(child) for name, child in model._modules.items()}
    return twin


@contextlib.contextmanager
def packed_for_decoding(model: nn.Module, weights: str, verify: bool = False):
    """Within the `with`, `model` decodes through `weights` copies, packed once for every batch
    (`decoding_weights`, `packed_linears`); with `verify`, beside it the float32 twin that checks its
    greedy drafts, packed too, is yielded (None without verify, or where the weights fall back to
    fp32: the model's tokens are float32's then)."""
    if verify and not cuttable(model):
        raise ConfigError("verify=true: this model's linear-attention layers keep a recurrent state, which "
                          "cannot be taken back to before a refused draft; leave verify off")
    verifier = float32_twin(model) if verify and effective_weights(model, weights) != "fp32" else None
    with (decoding_weights(model, weights), packed_linears(model),
          packed_linears(verifier) if verifier is not None else contextlib.nullcontext()):
        yield verifier


def cuttable(model: nn.Module) -> bool:
    """Whether `model`'s decoding state is a KV cache alone, which a cut of its length rewinds."""
    return "linear_attention" not in (model.config.layer_types or ())


@torch.no_grad()
def verified_greedy(model, verifier, input_ids: torch.Tensor, max_new_tokens: int, eos_id: int | None = None,
                    draft_tokens: int = DRAFT_TOKENS) -> torch.Tensor:
    """The prompt input_ids [1, T] and up to max_new_tokens greedy tokens of `verifier` (float32),
    drafted through `model` (the same weights, low precision), [1, T + n]; it stops after eos_id."""
    if input_ids.shape[0] != 1:
        raise ValueError(f"verified greedy decoding takes one prompt at a time, not {input_ids.shape[0]}")
    T = input_ids.shape[1]
    cache = KVCache(model.config, 1, T + max_new_tokens + draft_tokens + 1)
    hidden = verifier.hidden_states(input_ids, kv_cache=cache)[:, -1]
    out = [int(verifier.lm_head(hidden).argmax(-1))]
    direct = decode_step.plan(model, hidden)
    while len(out) < max_new_tokens and out[-1] != eos_id:
        kept = cache.length  # every token but the last of `out`
        draft = drafted(model, direct, out[-1], cache, min(draft_tokens, max_new_tokens - len(out)), eos_id)
        cache.length = kept
        checked = verifier.lm_head(verifier.hidden_states(input_ids.new_tensor([[out[-1], *draft]]),
                                                          kv_cache=cache)).argmax(-1)[0].tolist()
        agreed = next((i for i, (d, c) in enumerate(zip(draft, checked)) if d != c), len(draft))
        out += checked[:agreed + 1]  # the drafted tokens float32 keeps, then float32's own
        cache.length = kept + 1 + agreed
    out = out[:max_new_tokens]
    if eos_id in out:
        out = out[:out.index(eos_id) + 1]
    return torch.cat([input_ids, input_ids.new_tensor([out])], 1)


def drafted(model, direct, token: int, cache: KVCache, n: int, eos_id: int | None) -> list[int]:
    """Up to n greedy tokens of `model` after `token` (which the cache does not hold yet), one
    decoding step each; fewer when one is eos_id."""
    tokens = []
    for _ in range(n):
        ids = torch.tensor([[token]])
        hidden = (model.hidden_states(ids, kv_cache=cache) if direct is None
                  else decode_step.step_hidden(model, direct, ids, None, cache, None))[:, -1]
        token = int(model.lm_head(hidden).argmax(-1))
        tokens.append(token)
        if token == eos_id:
            break
    return tokens
