"""Which GGML type each tensor of a K-quant file gets, as llama.cpp's quantiser chooses it
(src/llama-quant.cpp: `llama_tensor_get_type` and `tensor_type_fallback`), and the importance
matrix llama.cpp's `llama-quantize --imatrix` reads.

A mix (`q4_k_m`, …) has a default type (Q2_K for q2_k, Q3_K for q3_k_s/m/l, Q4_K for q4_k_s/m, Q5_K
for q5_k_s/m, Q6_K for q6_k) that every quantised matrix gets, except:
- `output.weight` (the token embedding when the head is tied) is Q6_K — Q8_0 where its rows are not
  a multiple of 256 values;
- `attn_v` and `ffn_down` of some layers get more bits: in q4_k_m and q5_k_m those where
  `use_more_bits(layer, layers)` (the first and last eighth and every third between) are Q6_K; in
  q4_k_s the first four attn_v and the first eighth of ffn_down are Q5_K; in q3_k_m the first two
  attn_v and the first sixteenth of ffn_down are Q5_K, the other attn_v and ffn_down Q4_K; in q3_k_l
  every attn_v and ffn_down is Q5_K; in q2_k every attn_v is Q3_K (Q4_K where 4 or more query
  heads share a key head) and every ffn_down Q3_K;
- `attn_output` is Q3_K in q2_k, Q4_K in q3_k_m, Q5_K in q3_k_l (q3_k_s changes nothing);
- a matrix whose rows are not a multiple of the 256 values of a K block falls back as llama.cpp
  falls back: Q2_K and Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0 (blocks of 32), and
  F16 where the rows are not a multiple of 32 either (an output matrix of such rows, which llama.cpp refuses to quantise
  — it has no fallback for Q8_0 — stays F16 here).
Vectors (norms, biases) stay F32. llama.cpp counts attn_v and ffn_down in its tensor order
(by layer, then name), which for these models is the layer index.

Qwen3.5's `qwen35` layout follows the same rules: llama.cpp counts a fused `attn_qkv` (a Gated
DeltaNet layer's in_proj_qkv) as an attn_v, so with one attn_qkv or attn_v in every layer the i-th
is still layer i's, and `use_more_bits` spreads over all layers, not only the full-attention ones
(q4_k_m of 8 layers: the attn_qkv of layers 0 and 6, the attn_v of 3 and 7 get Q6_K). The other
Gated DeltaNet matrices (attn_gate, ssm_alpha, ssm_beta, ssm_out) take the mix's default type;
ssm_conv1d stays F32 and ssm_a, ssm_dt.bias and ssm_norm are vectors.

The importance matrix holds, per matrix, a weight per column (the mean square of the
activations that column meets): llama.cpp's GGUF format (`<tensor>.in_sum2` and
`<tensor>.counts`: weight = in_sum2 / count, 1 where the count is 0) or the legacy `.dat` (the
values over the number of calls). A matrix it does not name is quantised without weights, and
the token embedding's entry is used only when its width matches, as llama.cpp does.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

from llmkit.errors import UserError

MIXES = {  # --set quant= -> (llama.cpp's file type, the mix's default type)
    "q2_k": ("MOSTLY_Q2_K", "Q2_K"),
    "q3_k_s": ("MOSTLY_Q3_K_S", "Q3_K"),
    "q3_k_m": ("MOSTLY_Q3_K_M", "Q3_K"),
    "q3_k_l": ("MOSTLY_Q3_K_L", "Q3_K"),
    "q4_k_s": ("MOSTLY_Q4_K_S", "Q4_K"),
    "q4_k_m": ("MOSTLY_Q4_K_M", "Q4_K"),
    "q5_k_s": ("MOSTLY_Q5_K_S", "Q5_K"),
    "q5_k_m": ("MOSTLY_Q5_K_M", "Q5_K"),
    "q6_k": ("MOSTLY_Q6_K", "Q6_K"),
}
QK_K = 256
FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}  # tensor_type_fallback
BLOCK = {"Q2_K": QK_K, "Q3_K": QK_K, "Q4_K": QK_K, "Q5_K": QK_K, "Q6_K": QK_K,
         "Q4_0": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32}
NOT_QUANTISED = ("_norm.weight", "ssm_conv1d")  # llama.cpp's tensor_allows_quantization, for our names
ATTN_V_LIKE = ("attn_qkv.weight", "attn_v.weight")  # llama.cpp's category_is_attn_v, for our names


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v / ffn_down get more bits."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def llama_cpp_order(name: str) -> tuple[int, str]:
    """llama.cpp's weight_name_comparer: by layer (tensors outside blocks first), then by name."""
    match = re.match(r"blk\.(\d+)\.", name)
    return (int(match.group(1)) if match else -1, name)


def mix_types(mix: str, tensors: dict[str, tuple[int, ...]], n_layers: int, n_gqa: int = 1) -> dict[str, str]:
    """The GGML type of each tensor (GGUF name -> numpy shape, rows last) in a `mix` file; `n_gqa`: query
    heads per key head (llama.cpp's n_gqa, which q2_k's attn_v follows)."""
    default = MIXES[mix][1]
    tied = "output.weight" not in tensors
    counters = {"attn_v": 0, "ffn_down": 0}
    types = {}
    for name in sorted(tensors, key=llama_cpp_order):
        shape = tensors[name]
        if len(shape) < 2 or not name.endswith("weight") or any(part in name for part in NOT_QUANTISED):
            types[name] = "F32" if len(shape) < 2 or "ssm_conv1d" in name else "F16"
            continue
        new = default
        if name == "output.weight" or (tied and name == "token_embd.weight"):
            new = "Q8_0" if shape[-1] % BLOCK[default] else "Q6_K"
        elif any(part in name for part in ATTN_V_LIKE):
            new = attn_v_type(mix, counters["attn_v"], n_layers, n_gqa) or default
            counters["attn_v"] += 1
        elif "ffn_down" in name:
            new = ffn_down_type(mix, counters["ffn_down"], n_layers) or default
            counters["ffn_down"] += 1
        elif "attn_output.weight" in name:
            new = {"q2_k": "Q3_K", "q3_k_m": "Q4_K", "q3_k_l": "Q5_K"}.get(mix, default)
        types[name] = fallback(new, shape[-1])
    return types


def attn_v_type(mix: str, i: int, n_layers: int, n_gqa: int) -> str | None:
    """llama_tensor_get_type's type for the i-th attn_v of a mix, or None for the mix's default."""
    if mix == "q2_k":
        return "Q4_K" if n_gqa >= 4 else "Q3_K"
    if mix == "q3_k_m":
        return "Q5_K" if i < 2 else "Q4_K"
    if mix == "q3_k_l":
        return "Q5_K"
    if mix in ("q4_k_m", "q5_k_m") and use_more_bits(i, n_layers):
        return "Q6_K"
    return "Q5_K" if mix == "q4_k_s" and i < 4 else None


def ffn_down_type(mix: str, i: int, n_layers: int) -> str | None:
    """llama_tensor_get_type's type for the i-th ffn_down of a mix (not Falcon), or None for the default."""
    if mix == "q2_k":
        return "Q3_K"
    if mix == "q3_k_m":
        return "Q5_K" if i < n_layers // 16 else "Q4_K"
    if mix == "q3_k_l":
        return "Q5_K"
    if mix in ("q4_k_m", "q5_k_m") and use_more_bits(i, n_layers):
        return "Q6_K"
    return "Q5_K" if mix == "q4_k_s" and i < n_layers // 8 else None


def fallback(qtype: str, ncols: int) -> str:
    """llama.cpp's tensor_type_fallback: the type a matrix of `ncols`-value rows can hold."""
    if ncols % BLOCK[qtype] == 0:
        return qtype
    qtype = FALLBACK.get(qtype)  # Q8_0 (an output matrix): llama.cpp's quantiser gives up; F16 here
    return qtype if qtype and ncols % BLOCK[qtype] == 0 else "F16"


def read_imatrix(path: Path) -> dict[str, "object"]:
    """An importance matrix file -> {GGUF tensor name: float32 column weights}; a UserError
    naming the file when it is missing or in neither of llama.cpp's formats."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"imatrix file {path} does not exist: give llama.cpp's imatrix output "
                        "(its GGUF format or the legacy .dat) with --set imatrix=FILE")
    with path.open("rb") as f:
        magic = f.read(4)
    try:
        return read_gguf_imatrix(path) if magic == b"GGUF" else read_legacy_imatrix(path)
    except (ValueError, struct.error, UnicodeDecodeError, KeyError) as e:
        raise UserError(f"{path} is not an importance matrix llama.cpp writes ({e})") from None


def read_gguf_imatrix(path: Path) -> dict:
    """llama-imatrix's GGUF output: per matrix, `.in_sum2` (sums of squared activations per
    column, one row per expert) and `.counts` (how many activations each row summed)."""
    import gguf
    import numpy as np

    tensors = {t.name: np.asarray(t.data, dtype=np.float32) for t in gguf.GGUFReader(path).tensors}
    weights = {}
    for key, sums in tensors.items():
        if not key.endswith(".in_sum2"):
            continue
        name = key[: -len(".in_sum2")]
        counts = tensors[name + ".counts"].reshape(-1)
        sums = sums.reshape(counts.size, -1)
        values = np.ones_like(sums)  # a matrix (an expert) the calibration never reached: weight 1
        seen = counts > 0
        values[seen] = sums[seen] / counts[seen, None]
        weights[name] = values.reshape(-1)
    if not weights:
        raise ValueError("no <tensor>.in_sum2 entries")
    return weights


def read_legacy_imatrix(path: Path) -> dict:
    """llama-imatrix's legacy .dat: int32 count, then per entry its name, ncall, and the values
    (sums already divided by their counts, times ncall); llama.cpp divides by ncall again."""
    import numpy as np

    data = path.read_bytes()
    (n_entries,), at = struct.unpack_from("<i", data, 0), 4
    if not 0 < n_entries < 1_000_000:
        raise ValueError(f"{n_entries} entries")
    weights = {}
    for _ in range(n_entries):
        (length,) = struct.unpack_from("<i", data, at)
        name = data[at + 4:at + 4 + length].decode()
        ncall, nval = struct.unpack_from("<ii", data, at + 4 + length)
        at += 12 + length
        values = np.frombuffer(data, np.float32, nval, at).copy()
        at += 4 * nval
        if ncall > 0:
            values /= np.float32(ncall)
        weights[name] = values
    return weights


def tensor_weights(imatrix: dict | None, name: str, n_per_row: int):
    """The column weights llama.cpp uses for tensor `name`, or None (no imatrix, no entry, or the
    token embedding's entry of another width); a UserError where another tensor's width differs."""
    values = None if imatrix is None else imatrix.get(name)
    if values is None:
        return None
    if values.size != n_per_row:
        if name == "token_embd.weight":
            return None
        raise UserError(f"the importance matrix has {values.size} weights for {name}, whose rows have "
                        f"{n_per_row} values: it was computed for another model")
    return values
