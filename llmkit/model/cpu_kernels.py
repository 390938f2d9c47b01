"""llmkit's own float32 kernels for decoding on CPUs with AVX-512 (`cpu_kernels.cpp`): few-row
products through weights laid out in panels (`PanelWeight`), one new token's attention over the
KV cache (`decode_attention`), and the small steps between them without gradients (`rms_norm`,
`silu_times`, `rotate_`: one pass over a step's few rows instead of torch's several ops).

A decoding step multiplies a few rows (the batch) by every weight matrix: the weights stream from
memory while the FMAs on them run, and neither MKL's sgemm nor oneDNN's packed product overlaps
the two well at 1-16 rows. This kernel reads each matrix once, laid out in panels of 16 output
columns, prefetching ahead: SmolLM2's 30 gate/up matrices at 16 rows take 22.5 ms instead of
oneDNN's 26.6 at 1 thread, 11.5 instead of 14.7 at 2; at hundreds of rows (a prompt's prefill) it
is within 3% of oneDNN (`bench/decode_floor.py` times all three). Each output is one FMA chain over
the inputs in order, the same whatever the row count: a row's result does not depend on its batch.

A decoding step's attention reads every layer's cached keys and values once: torch's SDPA (its
flash kernel, even for one query) took 0.40 ms a SmolLM2 layer at 16 rows and 100 cached tokens,
1 thread; this kernel reads the keys and values of a row and head group straight from the cache,
once for the query heads that share them (GQA), with its own vectorised exponential: 0.30 ms (30 layers: 8.9 ms instead of 13.1; 5.2 instead of 6.4-7.0 at 2 threads).

The source compiles on first use (about 2 s with g++; `make setup` does it) into `__pycache__/`, named by a hash of the
source and the compiler, and loads through ctypes; where it cannot (no C++ compiler, a CPU without
AVX-512, not x86-64) `available()` is False and callers keep oneDNN. A failed build is remembered
(the `.failed` file) so that not every process retries it. LLMKIT_CPU_KERNELS=0 turns both off.

Low-precision weights (`cpu_kernels_lowprec.cpp`, `decode.weights`: `llmkit.model.decode_weights`):
`Bf16PanelWeight` (AVX-512), `F16PanelWeight` (and F16C) and `Int8PanelWeight` (q8_0's blocks, AVX-512 VNNI) run where
`low_precision_available` says this CPU has the instructions; LLMKIT_CPU_KERNELS=fp32 keeps the
float32 kernels only, as a CPU without them would. Both multiply by rows kept (near) float32, so that
greedy decoding keeps float32's tokens; LLMKIT_LOWPREC_ROWS=rounded picks the rows rounded as the
weights are (bf16; q8_0, as llama.cpp does), kept to measure the difference.

Every panel of 64 KB or more sits on 2 MB pages where the kernel allows it
(`llmkit.model.huge_pages`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from llmkit.core.aot import writable_cache_folder
from llmkit.model.huge_pages import panel_storage

SOURCE = Path(__file__).with_suffix(".cpp")
SOURCES = (SOURCE, SOURCE.with_name(f"{SOURCE.stem}_lowprec.cpp"))  # compiled into one library


def available() -> bool:
    return os.environ.get("LLMKIT_CPU_KERNELS", "1") != "0" and library() is not None


def low_precision_available(weights: str) -> bool:
    """Whether products through `weights` ("bf16": AVX-512, "f16": and F16C, "int8": AVX-512 VNNI) run on this CPU;
    LLMKIT_CPU_KERNELS=fp32 says no (the float32 kernels only), as on a CPU without the instructions."""
    if os.environ.get("LLMKIT_CPU_KERNELS", "1") == "fp32" or not available():
        return False
    return bool(getattr(library(), f"llmkit_{weights}_supported")())


class PanelWeight:
    """A float32 weight [out_features, in_features] laid out for `product` (one more copy of it)."""

    __slots__ = ("panels", "out_features", "in_features", "kernel")

    def __init__(self, weight: torch.Tensor):
        lib = library()
        self.kernel = lib.llmkit_panel_product
        self.out_features, self.in_features = weight.shape
        weight = weight.detach().contiguous()
        self.panels = panel_storage(lib.llmkit_panel_floats(*weight.shape), dtype=torch.float32)
        lib.llmkit_panel_pack(weight.data_ptr(), *weight.shape, self.panels.data_ptr(), torch.get_num_threads())

    def product(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., in_features] float32 -> x Wᵀ + bias [..., out_features]."""
        if x.dtype != torch.float32 or x.device.type != "cpu":
            raise TypeError(f"the panel kernel multiplies float32 CPU tensors, not {x.dtype} on {x.device}")
        rows = x.reshape(-1, self.in_features).contiguous()
        y = torch.empty(rows.shape[0], self.out_features, dtype=torch.float32)
        bias = None if bias is None else bias.detach().contiguous()  # held: the kernel reads its memory
        self.kernel(rows.data_ptr(), rows.shape[0], self.in_features, self.panels.data_ptr(), address(bias),
                    self.out_features, y.data_ptr(), torch.get_num_threads())
        return y.view(*x.shape[:-1], self.out_features)


def _rounded_rows() -> bool:
    return os.environ.get("LLMKIT_LOWPREC_ROWS") == "rounded"


class Bf16PanelWeight:
    """A weight [out_features, in_features] rounded to bfloat16 (nearest even) in panels: `product`
    multiplies float32 rows by it (each weight widened to float32 in registers, float32 FMA), or with
    LLMKIT_LOWPREC_ROWS=rounded and AVX512-BF16 the rows rounded to bfloat16 too (its dot product)."""

    __slots__ = ("panels", "out_features", "in_features", "kernel")

    def __init__(self, weight: torch.Tensor):
        lib = library()
        rounded = _rounded_rows() and lib.llmkit_bf16_rows_supported()
        self.kernel = lib.llmkit_bf16_panel_product_bf16_rows if rounded else lib.llmkit_bf16_panel_product
        self.out_features, self.in_features = weight.shape
        weight = weight.detach().float().contiguous()
        self.panels = panel_storage(lib.llmkit_bf16_panel_values(*weight.shape), dtype=torch.int16)
        lib.llmkit_bf16_panel_pack(weight.data_ptr(), *weight.shape, self.panels.data_ptr(), torch.get_num_threads())

    def product(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return _low_precision_product(self, self.kernel, x, bias)

    def dequantized(self) -> torch.Tensor:
        """The weight [out, in] this multiplies by, as float32."""
        w = torch.empty(self.out_features, self.in_features, dtype=torch.float32)
        library().llmkit_bf16_panel_unpack(self.panels.data_ptr(), self.out_features, self.in_features, w.data_ptr())
        return w


class F16PanelWeight:
    """A weight [out_features, in_features] rounded to fp16 (nearest even; 3 more mantissa bits than
    bf16, the same bytes) in panels of one input a vector: `product` widens each to float32 in
    registers (vcvtph2ps) and multiplies the float32 rows with float32 FMA."""

    __slots__ = ("panels", "out_features", "in_features", "kernel")

    def __init__(self, weight: torch.Tensor):
        lib = library()
        self.kernel = lib.llmkit_f16_panel_product
        self.out_features, self.in_features = weight.shape
        weight = weight.detach().float().contiguous()
        self.panels = panel_storage(lib.llmkit_f16_panel_values(*weight.shape), dtype=torch.int16)
        lib.llmkit_f16_panel_pack(weight.data_ptr(), *weight.shape, self.panels.data_ptr(), torch.get_num_threads())

    def product(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return _low_precision_product(self, self.kernel, x, bias)

    def dequantized(self) -> torch.Tensor:
        """The weight [out, in] this multiplies by, as float32."""
        w = torch.empty(self.out_features, self.in_features, dtype=torch.float32)
        library().llmkit_f16_panel_unpack(self.panels.data_ptr(), self.out_features, self.in_features, w.data_ptr())
        return w


class Int8PanelWeight:
    """A weight [out_features, in_features] in GGUF q8_0's blocks (per output and 32 inputs: an fp16
    scale max|w| / 127 and int8 values) in panels: `product` quantises the rows per block of 32 in two
    parts (d (q + r / 254): 16 bits a value) and multiplies each with integer sums (AVX-512 VNNI),
    scaled into float32 sums; with LLMKIT_LOWPREC_ROWS=rounded the rows as q8_0 (q only, llama.cpp's)."""

    __slots__ = ("panels", "out_features", "in_features", "kernel")

    def __init__(self, weight: torch.Tensor):
        lib = library()
        self.kernel = lib.llmkit_int8_panel_product_q8_rows if _rounded_rows() else lib.llmkit_int8_panel_product
        self.out_features, self.in_features = weight.shape
        weight = weight.detach().float().contiguous()
        self.panels = panel_storage(lib.llmkit_int8_panel_bytes(*weight.shape), dtype=torch.uint8)
        lib.llmkit_int8_panel_pack(weight.data_ptr(), *weight.shape, self.panels.data_ptr(), torch.get_num_threads())

    def product(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return _low_precision_product(self, self.kernel, x, bias)

    def dequantized(self) -> torch.Tensor:
        """The weight [out, in] this multiplies by, as float32."""
        w = torch.empty(self.out_features, self.in_features, dtype=torch.float32)
        library().llmkit_int8_panel_unpack(self.panels.data_ptr(), self.out_features, self.in_features, w.data_ptr())
        return w


def quantized_rows(x: torch.Tensor, split: bool = True) -> torch.Tensor:
    """x [rows, in] float32 as `Int8PanelWeight.product` quantises it (per row and block of 32; split:
    in two parts, else as q8_0), as float32."""
    x = x.contiguous()
    out = torch.empty_like(x)
    library().llmkit_int8_quantize_rows(x.data_ptr(), x.shape[0], x.shape[1], out.data_ptr(), int(split))
    return out


def _low_precision_product(weight, kernel, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., in_features] float32 -> x Wᵀ + bias [..., out_features] through `kernel`."""
    if x.dtype != torch.float32 or x.device.type != "cpu":
        raise TypeError(f"the panel kernel multiplies float32 CPU tensors, not {x.dtype} on {x.device}")
    rows = x.reshape(-1, weight.in_features).contiguous()
    y = torch.empty(rows.shape[0], weight.out_features, dtype=torch.float32)
    bias = None if bias is None else bias.detach().float().contiguous()  # held: the kernel reads its memory
    kernel(rows.data_ptr(), rows.shape[0], weight.in_features, weight.panels.data_ptr(), address(bias),
           weight.out_features, y.data_ptr(), torch.get_num_threads())
    return y.view(*x.shape[:-1], weight.out_features)


def attends(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether `decode_attention` takes these: one float32 query per row on CPU, a head size of
    16 to 256 (a power of two), keys and values stored as a KV cache's rows, no gradient."""
    B, H, T, D = q.shape
    return (T == 1 and q.dtype == k.dtype == v.dtype == torch.float32 and q.device.type == "cpu"
            and not torch.is_grad_enabled() and k.stride() == v.stride() and k.stride()[2:] == (D, 1)
            and available() and bool(library().llmkit_attention_takes(D)))


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None):
    """softmax(q kᵀ / sqrt(D)) v for one new token: q [B, H, 1, D], k and v [B, Hkv, L, D] (see `attends`),
    key_mask [B, L] bool (True = may attend) or None -> [B, 1, H * D]."""
    B, H, _, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    q = q.contiguous()
    out = torch.empty(B, 1, H * D, dtype=torch.float32)
    key_mask = None if key_mask is None else key_mask.to(torch.bool).contiguous()  # held, as q: the kernel reads it
    library().llmkit_decode_attention(q.data_ptr(), k.data_ptr(), v.data_ptr(), k.stride(0), k.stride(1),
                                      address(key_mask), B, H, Hkv, L, D, D ** -0.5, out.data_ptr(),
                                      torch.get_num_threads())
    return out


def elementwise(*tensors: torch.Tensor) -> bool:
    """Whether the small steps' kernels (`rms_norm`, `silu_times`, `rotate_`) take these tensors:
    float32 on CPU, no gradient, outside `training_ops`."""
    return (not torch.is_grad_enabled() and not _training_ops and available()
            and all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors))


_training_ops = 0  # how many `training_ops` withs are open


@contextlib.contextmanager
def training_ops():
    """Within the `with`, a pass without gradients takes torch's ops for the small steps, as a training
    pass does, and gives its numbers to the last bit: for the log-probs a training pass is compared
    with (RL's sampling policy and reference, DPO's reference). Products rounded to bf16
    (`lora.base_products`) turn the kernels' last-bit differences into 0.045 in the log-prob of
    SmolLM2's likeliest token, on average: a KL of 0.058 where the policy is its reference."""
    global _training_ops
    _training_ops += 1
    try:
        yield
    finally:
        _training_ops -= 1


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x²) + eps) * weight over the last dimension."""
    x, weight = x.contiguous(), weight.detach().contiguous()  # held while the kernel reads them
    out = torch.empty_like(x)
    library().llmkit_rms_norm(x.data_ptr(), weight.data_ptr(), x.numel() // x.shape[-1], x.shape[-1], eps,
                              out.data_ptr(), torch.get_num_threads())
    return out


def silu_times(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor | None:
    """silu(gate) * up, or None where gate and up are not rows of one stride (the halves of a
    grouped product, or contiguous tensors)."""
    width = gate.shape[-1]
    try:
        gate_rows, up_rows = gate.view(-1, width), up.view(-1, width)
    except RuntimeError:
        return None
    if gate_rows.stride() != up_rows.stride() or gate_rows.stride(1) != 1:
        return None
    out = torch.empty(gate.shape, dtype=torch.float32)
    library().llmkit_silu_times(gate.data_ptr(), up.data_ptr(), gate_rows.shape[0], width, gate_rows.stride(0),
                                out.data_ptr(), torch.get_num_threads())
    return out


def rotate_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, D] (any strides, each head's D values contiguous) rotated in place by the rotary
    embedding, cos and sin [T, D] or [B, 1, T, D] as `llmkit.model.transformer.rope_tables` gives them."""
    B, heads, T, D = x.shape
    cos, sin = cos.contiguous(), sin.contiguous()
    cb, ct = (0, cos.stride(0)) if cos.dim() == 2 else (cos.stride(0), cos.stride(2))
    library().llmkit_rotate(x.data_ptr(), B, T, heads, D, x.stride(0), x.stride(2), x.stride(1), cos.data_ptr(),
                            sin.data_ptr(), cb, ct, torch.get_num_threads())
    return x


def delta_step_takes(x: torch.Tensor, delta: torch.Tensor, v_head_dim: int) -> bool:
    """Whether `delta_step` takes a Gated DeltaNet layer's step: float32 on CPU, no gradient, a value
    head size that is a multiple of 16 up to 256."""
    return elementwise(x, delta) and bool(library().llmkit_delta_step_takes(v_head_dim))


def delta_step(layer, qkv: torch.Tensor, z: torch.Tensor, a: torch.Tensor, b: torch.Tensor, conv: torch.Tensor,
               delta: torch.Tensor) -> torch.Tensor:
    """One decoding step of `layer` (a `llmkit.model.gated_deltanet.GatedDeltaNet`) from its projections
    qkv [B, C], z [B, Hv * Dv], a and b [B, Hv] (rows of unit stride): the conv, the delta rule and the
    gated norm in one call, `conv` [B, C, kernel - 1] (stored [B, kernel - 1, C]: `conv.transpose(1, 2)`
    contiguous) and `delta` [B, Hv, Dk, Dv] (contiguous) updated in place -> [B, Hv * Dv]."""
    B, C = qkv.shape
    Hk, Hv, Dk, Dv = layer.n_k_heads, layer.n_v_heads, layer.k_head_dim, layer.v_head_dim
    weight = layer.conv1d.weight.detach()[:, 0].t().contiguous()  # [kernel, C]: one tap's channels together
    params = [p.detach().contiguous() for p in (layer.A_log, layer.dt_bias, layer.norm.weight)]
    mixed = torch.empty(B, C, dtype=torch.float32)
    out = torch.empty(B, Hv * Dv, dtype=torch.float32)
    library().llmkit_delta_step(qkv.data_ptr(), qkv.stride(0), z.data_ptr(), z.stride(0), a.data_ptr(), a.stride(0),
                                b.data_ptr(), b.stride(0), weight.data_ptr(), weight.shape[0], conv.data_ptr(),
                                delta.data_ptr(), *(p.data_ptr() for p in params), layer.norm.eps, B, Hk, Hv, Dk,
                                Dv, mixed.data_ptr(), out.data_ptr(), torch.get_num_threads())
    return out


def address(t: torch.Tensor | None) -> int | None:
    """The address of t's first element (None for no tensor). The caller holds t while the kernel
    runs: the address of a temporary (`x.contiguous().data_ptr()`) is freed memory by then."""
    return None if t is None else t.data_ptr()


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernels, built if need be; None where they cannot be built or run here."""
    if platform.machine().lower() not in ("x86_64", "amd64") or sys.platform != "linux":
        return None
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    path = compiled_path(compiler) if compiler else None
    if path is None:
        return None
    failed = path.with_suffix(".failed")
    if failed.exists():
        return None
    if not path.exists():
        print("llmkit: compiling the CPU decoding kernels, once (about 3 s)", file=sys.stderr)
        try:
            build(compiler, path)
        except (OSError, subprocess.CalledProcessError) as e:
            failed.write_text(f"{type(e).__name__}: {getattr(e, 'stderr', '') or e}\n")
            return None
    lib = ctypes.CDLL(str(path))
    if not lib.llmkit_kernels_supported():
        return None
    declare(lib)
    return lib


def compiled_path(compiler: str) -> Path | None:
    """`__pycache__/cpu_kernels_<hash of the source and the compiler>.so`; None if not writable."""
    key = hashlib.sha256(b"".join(source.read_bytes() for source in SOURCES))
    key.update(compiler.encode())
    folder = writable_cache_folder(SOURCE.parent)
    return None if folder is None else folder / f"{SOURCE.stem}_{key.hexdigest()[:16]}.so"


def build(compiler: str, path: Path) -> None:
    """Compile SOURCES into `path` (atomically: concurrent processes may build it at once); older
    builds are deleted. OpenMP links libgomp.so.1, which a process that imported torch already
    holds (torch's wheels ship it): the kernel then runs on torch's own thread pool."""
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        out = Path(tmp) / path.name
        subprocess.run([compiler, "-O3", "-std=c++17", "-fopenmp", "-shared", "-fPIC", *map(str, SOURCES), "-o", str(out)],
                       check=True, capture_output=True, text=True)
        os.replace(out, path)
    for stale in path.parent.glob(f"{SOURCE.stem}_*"):
        if stale != path:
            stale.unlink(missing_ok=True)


def declare(lib: ctypes.CDLL) -> None:
    pointer, size, threads = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.llmkit_panel_floats.argtypes, lib.llmkit_panel_floats.restype = [size, size], size
    lib.llmkit_panel_pack.argtypes = [pointer, size, size, pointer, threads]
    lib.llmkit_panel_product.argtypes = [pointer, size, size, pointer, pointer, size, pointer, threads]
    lib.llmkit_attention_takes.argtypes = [size]
    lib.llmkit_rms_norm.argtypes = [pointer, pointer, size, size, ctypes.c_float, pointer, threads]
    lib.llmkit_silu_times.argtypes = [pointer, pointer, size, size, size, pointer, threads]
    lib.llmkit_rotate.argtypes = [pointer] + [size] * 7 + [pointer, pointer, size, size, threads]
    lib.llmkit_delta_step_takes.argtypes = [size]
    lib.llmkit_delta_step.argtypes = ([pointer, size] * 4 + [pointer, size] + [pointer] * 5 + [ctypes.c_float]
                                      + [size] * 5 + [pointer, pointer, threads])
    for kind, unit in (("bf16", "values"), ("f16", "values"), ("int8", "bytes")):
        getattr(lib, f"llmkit_{kind}_panel_{unit}").argtypes = [size, size]
        getattr(lib, f"llmkit_{kind}_panel_{unit}").restype = size
        getattr(lib, f"llmkit_{kind}_panel_pack").argtypes = [pointer, size, size, pointer, threads]
        getattr(lib, f"llmkit_{kind}_panel_unpack").argtypes = [pointer, size, size, pointer]
    for product in ("bf16_panel_product", "bf16_panel_product_bf16_rows", "f16_panel_product",
                    "int8_panel_product", "int8_panel_product_q8_rows"):
        getattr(lib, f"llmkit_{product}").argtypes = [pointer, size, size, pointer, pointer, size, pointer, threads]
    lib.llmkit_int8_quantize_rows.argtypes = [pointer, size, size, pointer, threads]
    lib.llmkit_decode_attention.argtypes = [pointer, pointer, pointer, size, size, pointer, size, size, size, size,
                                            size, ctypes.c_float, pointer, threads]
    lib.llmkit_decode_scratch.argtypes, lib.llmkit_decode_scratch.restype = [size] * 6, size
    lib.llmkit_decode_layers.argtypes = ([pointer, pointer, size, pointer] + [size] * 8 + [pointer, pointer, size, pointer,
                                         ctypes.c_float, pointer, threads])
