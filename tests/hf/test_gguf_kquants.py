"""llmkit's GGML block quantisers against llama.cpp's own (`ggml_quantize_chunk` of the ggml library
llama-cpp-python ships; skipped where the binding is absent): the same bytes for Q2_K, Q3_K, Q4_K,
Q5_K, Q6_K, Q4_0, Q5_0, Q5_1 and Q8_0, with and without an importance matrix, on weights shaped as
trained models are and on the blocks where rounding paths split (zeros, -0.0, constants, one sign,
tiny and heavy-tailed values). Without the binding: what the bytes decode to is close to the
weights, the importance matrix lowers the error where it weighs, each Q3_K / Q2_K value sits on
the level of its sub-block nearest to it (ggml's formula read in float64), planted blocks (zeros,
a constant) decode as they must, and threads do not change the bytes."""

from __future__ import annotations

import ctypes
from pathlib import Path

import gguf
import numpy as np
import pytest

from llmkit.hf.gguf_kquants import KERNEL_TYPES, f16_rounded, quantize

TYPES = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q5_0", "Q5_1", "Q8_0"]
GGML_TYPE = {"Q4_0": 2, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13,
             "Q6_K": 14}  # ggml's enum ggml_type


def weights(kind: str, rows: int = 8, cols: int = 512, seed: int = 0):
    """float32 weights as an f16 file holds them."""
    rng = np.random.default_rng(seed)
    x = {"normal": lambda: rng.standard_normal((rows, cols)) * 0.02,
         "heavy": lambda: rng.standard_t(2, (rows, cols)) * 0.01,
         "sparse": lambda: rng.standard_normal((rows, cols)) * (rng.random((rows, cols)) < 0.05),
         "positive": lambda: rng.random((rows, cols)),
         "negative": lambda: -rng.random((rows, cols)) * 1e-3,
         "constant": lambda: np.full((rows, cols), 0.25),
         "tiny": lambda: rng.standard_normal((rows, cols)) * 1e-6}[kind]()
    return x.astype(np.float16).astype(np.float32)


def column_weights(cols: int = 512, seed: int = 1):
    rng = np.random.default_rng(seed)
    w = (rng.random(cols) ** 4 * 10).astype(np.float32)
    w[:40] = 0  # columns the calibration never reached
    return w


def ggml_library():
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama.cpp's Python binding is not installed")
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    return lib


def llama_cpp_bytes(lib, x, qtype, qw):
    block, size = gguf.GGML_QUANT_SIZES[getattr(gguf.GGMLQuantizationType, qtype)]
    out = np.zeros((x.shape[0], x.shape[1] // block * size), np.uint8)
    lib.ggml_quantize_chunk(GGML_TYPE[qtype], x.ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1],
                            None if qw is None else qw.ctypes.data)
    return out


@pytest.mark.parametrize("imatrix", [False, True], ids=["reference", "imatrix"])
@pytest.mark.parametrize("qtype", TYPES)
def test_the_bytes_are_llama_cpps(qtype, imatrix):
    lib = ggml_library()
    qw = column_weights() if imatrix else None
    for kind in ("normal", "heavy", "sparse", "positive", "negative", "constant", "tiny"):
        x = weights(kind)
        x[0, :256] = 0  # a block of zeros
        x[1, :32] = -0.0
        expected = llama_cpp_bytes(lib, x, qtype, qw)
        got = quantize(x, qtype, qw)
        assert got.shape == expected.shape and got.dtype == np.uint8
        assert np.array_equal(got, expected), f"{qtype} {kind}: rows {np.nonzero((got != expected).any(1))[0]} differ"


@pytest.mark.parametrize("qtype", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q5_0", "Q5_1"])
def test_the_blocks_decode_near_the_weights_and_an_imatrix_lowers_the_weighted_error(qtype):
    x = weights("normal", rows=16)
    plain = gguf.quants.dequantize(quantize(x, qtype), getattr(gguf.GGMLQuantizationType, qtype))
    bits = {"Q2_K": 2, "Q3_K": 3, "Q4_K": 4, "Q5_K": 5, "Q6_K": 6, "Q4_0": 4, "Q5_0": 5, "Q5_1": 5}[qtype]
    assert np.abs(plain - x).max() < 4 * np.abs(x).max() / 2 ** bits
    importance = np.ones(x.shape[1], np.float32)
    importance[:64] = 1000.0  # a few columns carry the activations
    weighted = gguf.quants.dequantize(quantize(x, qtype, importance), getattr(gguf.GGMLQuantizationType, qtype))
    error = lambda y: float((((y - x) ** 2) * importance).sum())  # noqa: E731
    assert error(weighted) < error(plain)


def low_k_fields(data, qtype):
    """Each value's level and its sub-block's step and offset (value = step * level - offset), read from
    Q3_K / Q2_K blocks by ggml's layout in float64 (dequantize_row_q3_K / _q2_K)."""
    blocks = data.reshape(-1, 110 if qtype == "Q3_K" else 84).astype(np.int64)
    qs = blocks[:, 32:96] if qtype == "Q3_K" else blocks[:, 16:80]
    half = np.arange(256) // 128  # value i: bits 2 * ((i % 128) // 32) of byte 32 * half + i % 32
    pairs = (qs[:, 32 * half + np.arange(256) % 32] >> (2 * ((np.arange(256) % 128) // 32))) & 3
    f16 = lambda at: blocks[:, at:at + 2].astype(np.uint8).copy().view(np.float16).astype(np.float64)  # noqa: E731
    if qtype == "Q3_K":
        high = (blocks[:, np.arange(256) % 32] >> (np.arange(256) // 32)) & 1
        sc = blocks[:, 96:108]
        j = np.arange(16)
        low = np.where(j < 8, sc[:, j % 8] & 0xF, sc[:, j % 8] >> 4)
        scale = (low | (((sc[:, 8 + j % 4] >> (2 * (j // 4))) & 3) << 4)) - 32
        step = f16(108) * scale
        return pairs + 4 * high - 4, np.repeat(step, 16, axis=1), np.zeros((len(blocks), 256)), (-4, 3)
    step, offset = f16(80) * (blocks[:, :16] & 0xF), f16(82) * (blocks[:, :16] >> 4)
    return pairs, np.repeat(step, 16, axis=1), np.repeat(offset, 16, axis=1), (0, 3)


@pytest.mark.parametrize("imatrix", [False, True], ids=["reference", "imatrix"])
@pytest.mark.parametrize("qtype", ["Q3_K", "Q2_K"])
def test_each_low_k_value_sits_on_the_level_of_its_sub_block_nearest_to_it(qtype, imatrix):
    x = weights("heavy", rows=6)
    data = quantize(x, qtype, column_weights() if imatrix else None)
    level, step, offset, (lo, hi) = low_k_fields(data, qtype)
    decoded = gguf.quants.dequantize(data, getattr(gguf.GGMLQuantizationType, qtype)).reshape(-1, 256)
    assert np.allclose(decoded, step * level - offset, rtol=1e-6, atol=1e-12)  # the layout is ggml's
    xb = x.reshape(-1, 256).astype(np.float64)
    on = step != 0
    nearest = np.clip(np.round((xb + offset)[on] / step[on]), lo, hi)
    ties = np.abs(np.abs(((xb + offset)[on] / step[on]) % 1) - 0.5) < 1e-4  # float32's rounding decides these
    assert on.mean() > 0.9 and np.array_equal(nearest[~ties], level[on][~ties])


@pytest.mark.parametrize("qtype", ["Q3_K", "Q2_K"])
def test_a_zero_block_is_zero_bytes_and_a_constant_block_decodes_to_itself(qtype):
    x = np.zeros((2, 512), np.float32)
    x[1] = 0.25
    data = quantize(x, qtype)
    assert not data[0].any()
    decoded = gguf.quants.dequantize(data, getattr(gguf.GGMLQuantizationType, qtype)).reshape(2, 512)
    assert not decoded[0].any()
    if qtype == "Q3_K":  # scale -0.25 / 4 on the grid's end (-32 steps of d = 2**-9): exact
        assert np.array_equal(decoded[1], x[1])
    else:  # 3 steps of d * 15, d an f16
        assert np.allclose(decoded[1], 0.25, rtol=2 ** -10) and len(set(decoded[1])) == 1


def test_threads_and_chunks_do_not_change_the_bytes():
    x = weights("heavy", rows=200, cols=768)
    assert np.array_equal(quantize(x, "Q4_K", threads=1), quantize(x, "Q4_K", threads=3))


def test_rows_that_are_not_whole_blocks_are_refused():
    with pytest.raises(ValueError, match="not a multiple"):
        quantize(weights("normal", cols=320), "Q6_K")
    with pytest.raises(ValueError, match="not a multiple"):
        quantize(weights("normal", cols=320), "Q3_K")
    assert set(KERNEL_TYPES) == {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q5_0", "Q5_1"}


def test_the_f16_rounding_is_numpys_cast_bit_for_bit():
    """Every float32 exponent, halfway cases, the half's overflow and subnormal edges, infinities, NaNs."""
    rng = np.random.default_rng(0)
    bits = np.concatenate([np.arange(0, 2 ** 32, 65537, dtype=np.uint64).astype(np.uint32),
                           rng.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32),
                           np.arange(0x477FE000, 0x47800100, 16, dtype=np.uint32),  # 65504 .. above 65520
                           np.arange(0x387FF000, 0x38801000, 8, dtype=np.uint32),  # the smallest normal half
                           np.arange(0x33000000 - 40, 0x33000000 + 40, dtype=np.uint32),  # half the smallest subnormal
                           np.uint32(0x00001000) * np.arange(1, 64, dtype=np.uint32) + np.uint32(0x3F800000),  # ties
                           np.array([0, 0x7F800000, 0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0x7F802000], np.uint32)])
    bits = np.concatenate([bits, bits | np.uint32(0x80000000)])
    x = bits[: bits.size // 16 * 16].view(np.float32).reshape(-1, 16)
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16).astype(np.float32)
    assert np.array_equal(f16_rounded(x).view(np.uint32), expected.view(np.uint32))
