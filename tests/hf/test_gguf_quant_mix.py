"""The K-quant mixes of `llmkit export --format gguf --quant q4_k_m` (…): each tensor's type as
llama.cpp's quantiser chooses it (more bits for some attn_v / ffn_down layers, Q6_K output, the
fallbacks of rows that are not whole 256-value blocks; Qwen3.5's Gated DeltaNet attn_qkv counted
among attn_v), the importance matrix in llama.cpp's two file formats, and the whole file: every
tensor byte-identical to what llama.cpp's `llama_model_quantize` makes of llmkit's f16 file, with
and without the same importance matrix (skipped where llama-cpp-python is absent), on a llmkit
model and a Qwen3.5 one whose widths are multiples of 256 and on one of each whose are not."""

from __future__ import annotations

import ctypes
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.errors import UserError
from llmkit.hf.gguf_quant_mix import MIXES, mix_types, read_imatrix, tensor_weights, use_more_bits
from tests.hf.hybrid_fixtures import FULL, LINEAR, save_qwen35
from tests.train.posttrain_fixtures import make_tokenizer, tiny_model, write_checkpoint_run

pytestmark = pytest.mark.usefixtures("one_thread")


def llama_tensors(n_layers: int, hidden: int, ffn: int, tied: bool) -> dict:
    names = {"token_embd.weight": (300, hidden), "output_norm.weight": (hidden,)}
    if not tied:
        names["output.weight"] = (300, hidden)
    for i in range(n_layers):
        for part, shape in (("attn_q", (hidden, hidden)), ("attn_k", (64, hidden)), ("attn_v", (64, hidden)),
                            ("attn_output", (hidden, hidden)), ("ffn_gate", (ffn, hidden)),
                            ("ffn_up", (ffn, hidden)), ("ffn_down", (hidden, ffn)), ("attn_norm", (hidden,))):
            names[f"blk.{i}.{part}.weight"] = shape
    return names


def test_more_bits_go_where_llama_cpp_puts_them():
    assert [i for i in range(8) if use_more_bits(i, 8)] == [0, 3, 6, 7]
    assert [i for i in range(30) if use_more_bits(i, 30)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]
    types = mix_types("q4_k_m", llama_tensors(8, 256, 512, tied=False), 8)
    assert [i for i in range(8) if types[f"blk.{i}.attn_v.weight"] == "Q6_K"] == [0, 3, 6, 7]
    assert [i for i in range(8) if types[f"blk.{i}.ffn_down.weight"] == "Q6_K"] == [0, 3, 6, 7]
    assert {types[f"blk.{i}.{p}.weight"] for i in range(8) for p in ("attn_q", "attn_k", "ffn_up")} == {"Q4_K"}
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"
    assert types["output_norm.weight"] == types["blk.0.attn_norm.weight"] == "F32"
    small = mix_types("q4_k_s", llama_tensors(16, 256, 512, tied=True), 16)
    assert [i for i in range(16) if small[f"blk.{i}.attn_v.weight"] == "Q5_K"] == [0, 1, 2, 3]
    assert [i for i in range(16) if small[f"blk.{i}.ffn_down.weight"] == "Q5_K"] == [0, 1]
    assert small["token_embd.weight"] == "Q6_K"  # tied: the embedding is the output matrix
    assert set(mix_types("q6_k", llama_tensors(4, 256, 512, tied=False), 4).values()) == {"Q6_K", "F32"}


def qwen35_tensors(n_layers: int, hidden: int, ffn: int) -> dict:
    """A qwen35 file's tensors: three Gated DeltaNet layers (4 value heads of 64) to one full attention."""
    names = {"token_embd.weight": (300, hidden), "output.weight": (300, hidden), "output_norm.weight": (hidden,)}
    for i in range(n_layers):
        if (i + 1) % 4:
            parts = (("attn_qkv.weight", (512, hidden)), ("attn_gate.weight", (256, hidden)),
                     ("ssm_alpha.weight", (4, hidden)), ("ssm_beta.weight", (4, hidden)), ("ssm_a", (4,)),
                     ("ssm_conv1d.weight", (512, 4)), ("ssm_dt.bias", (4,)), ("ssm_norm.weight", (64,)),
                     ("ssm_out.weight", (hidden, 256)))
        else:
            parts = (("attn_q.weight", (512, hidden)), ("attn_k.weight", (64, hidden)), ("attn_v.weight", (64, hidden)),
                     ("attn_q_norm.weight", (64,)), ("attn_output.weight", (hidden, 256)))
        parts += (("ffn_gate.weight", (ffn, hidden)), ("ffn_up.weight", (ffn, hidden)),
                  ("ffn_down.weight", (hidden, ffn)), ("attn_norm.weight", (hidden,)))
        names.update({f"blk.{i}.{part}": shape for part, shape in parts})
    return names


def test_qwen35s_attn_qkv_counts_among_attn_v_over_all_layers_as_llama_cpp_counts_it():
    tensors = qwen35_tensors(8, 256, 512)

    def attn_v_like(types):  # each layer's attn_qkv (Gated DeltaNet) or attn_v (full attention, layers 3, 7)
        return [types.get(f"blk.{i}.attn_qkv.weight") or types[f"blk.{i}.attn_v.weight"] for i in range(8)]

    assert attn_v_like(mix_types("q4_k_m", tensors, 8)) == ["Q6_K", "Q4_K", "Q4_K", "Q6_K", "Q4_K", "Q4_K", "Q6_K",
                                                            "Q6_K"]  # use_more_bits(i, 8): 0, 3, 6, 7
    assert attn_v_like(mix_types("q3_k_m", tensors, 8)) == ["Q5_K"] * 2 + ["Q4_K"] * 6
    assert attn_v_like(mix_types("q4_k_s", tensors, 8)) == ["Q5_K"] * 4 + ["Q4_K"] * 4
    assert set(attn_v_like(mix_types("q2_k", tensors, 8, n_gqa=4))) == {"Q4_K"}
    types = mix_types("q4_k_m", tensors, 8)
    assert [i for i in range(8) if types[f"blk.{i}.ffn_down.weight"] == "Q6_K"] == [0, 3, 6, 7]
    assert {types[f"blk.0.{p}.weight"] for p in ("attn_gate", "ssm_alpha", "ssm_beta", "ssm_out")} == {"Q4_K"}
    assert types["blk.0.ssm_conv1d.weight"] == types["blk.0.ssm_a"] == types["blk.0.ssm_norm.weight"] == "F32"
    assert types["blk.3.attn_output.weight"] == types["blk.3.attn_k.weight"] == "Q4_K"
    assert set(mix_types("q6_k", tensors, 8).values()) == {"Q6_K", "F32"}


def test_the_2_and_3_bit_mixes_raise_attn_v_ffn_down_and_attn_output_as_llama_cpp_does():
    tensors = llama_tensors(16, 256, 512, tied=False)
    medium = mix_types("q3_k_m", tensors, 16)
    assert [medium[f"blk.{i}.attn_v.weight"] for i in range(4)] == ["Q5_K", "Q5_K", "Q4_K", "Q4_K"]
    assert [medium[f"blk.{i}.ffn_down.weight"] for i in range(3)] == ["Q5_K", "Q4_K", "Q4_K"]  # 16 // 16 = 1
    assert medium["blk.5.attn_output.weight"] == "Q4_K"
    assert medium["blk.5.attn_q.weight"] == medium["blk.5.ffn_up.weight"] == medium["token_embd.weight"] == "Q3_K"
    assert medium["output.weight"] == "Q6_K"
    raised = ("attn_v", "ffn_down", "attn_output")
    large = mix_types("q3_k_l", tensors, 16)
    assert {large[f"blk.{i}.{p}.weight"] for i in range(16) for p in raised} == {"Q5_K"}
    assert set(mix_types("q3_k_s", tensors, 16).values()) == {"Q3_K", "Q6_K", "F32"}
    two = mix_types("q2_k", tensors, 16)
    assert {two[f"blk.{i}.{p}.weight"] for i in range(16) for p in raised} == {"Q3_K"}
    assert two["blk.3.attn_k.weight"] == two["token_embd.weight"] == "Q2_K" and two["output.weight"] == "Q6_K"
    grouped = mix_types("q2_k", tensors, 16, n_gqa=4)  # 4 query heads a key head: attn_v gets Q4_K
    assert {grouped[f"blk.{i}.attn_v.weight"] for i in range(16)} == {"Q4_K"}


def test_rows_that_are_not_whole_k_blocks_fall_back_as_llama_cpp_does():
    types = mix_types("q4_k_m", llama_tensors(4, 576, 1536, tied=True), 4)  # SmolLM2-135M's widths
    assert types["blk.1.attn_q.weight"] == "Q5_0" and types["blk.1.ffn_down.weight"] == "Q4_K"  # 1536 = 6 x 256
    assert types["blk.3.attn_v.weight"] == "Q8_0" and types["blk.0.attn_v.weight"] == "Q5_0"  # Q6_K -> Q8_0
    assert types["token_embd.weight"] == "Q8_0"  # the tied output, 576 wide
    assert mix_types("q5_k_s", llama_tensors(2, 576, 1536, tied=True), 2)["blk.1.attn_q.weight"] == "Q5_1"
    assert mix_types("q4_k_m", llama_tensors(2, 48, 64, tied=True), 2)["blk.1.attn_q.weight"] == "F16"
    medium = mix_types("q3_k_m", llama_tensors(4, 576, 1536, tied=True), 4)  # Q3_K -> Q4_0
    assert medium["blk.1.attn_q.weight"] == medium["blk.1.ffn_up.weight"] == "Q4_0"
    assert medium["blk.0.attn_v.weight"] == "Q5_1" and medium["blk.2.ffn_down.weight"] == "Q4_K"
    two = mix_types("q2_k", llama_tensors(2, 576, 1536, tied=True), 2)  # Q2_K and Q3_K -> Q4_0
    assert two["blk.1.attn_q.weight"] == two["blk.1.attn_v.weight"] == two["blk.1.attn_output.weight"] == "Q4_0"
    assert two["blk.1.ffn_down.weight"] == "Q3_K" and two["token_embd.weight"] == "Q8_0"
    assert mix_types("q2_k", llama_tensors(2, 48, 64, tied=True), 2)["blk.1.attn_q.weight"] == "F16"


def test_an_imatrix_reads_from_both_of_llama_cpps_formats(tmp_path):
    values = np.arange(1, 9, dtype=np.float32)
    legacy = tmp_path / "imatrix.dat"
    name = b"blk.0.attn_q.weight"
    legacy.write_bytes(struct.pack("<ii", 1, len(name)) + name + struct.pack("<ii", 4, 8) + (values * 4).tobytes())
    assert np.array_equal(read_imatrix(legacy)["blk.0.attn_q.weight"], values)
    writer = gguf.GGUFWriter(str(tmp_path / "imatrix.gguf"), arch="imatrix")
    writer.add_tensor("blk.0.attn_q.weight.in_sum2", np.stack([values * 3, values]))  # two experts
    writer.add_tensor("blk.0.attn_q.weight.counts", np.array([[3.0, 0.0]], np.float32))
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file, writer.close):
        step()
    read = read_imatrix(tmp_path / "imatrix.gguf")["blk.0.attn_q.weight"]
    assert np.array_equal(read, np.concatenate([values, np.ones(8, np.float32)]))  # no count: weight 1
    with pytest.raises(UserError, match="missing.dat"):
        read_imatrix(tmp_path / "missing.dat")
    with pytest.raises(UserError, match="another model"):
        tensor_weights({"blk.0.attn_q.weight": values}, "blk.0.attn_q.weight", 16)
    assert tensor_weights({"token_embd.weight": values}, "token_embd.weight", 16) is None


def invoke(*args, code=0):
    r = CliRunner().invoke(build_app(), [str(a) for a in args])
    assert r.exit_code == code, r.output
    return r


SHAPES = {  # widths multiples of 256, untied; widths of 32s (fallbacks), tied
    "k-blocks": dict(hidden_size=256, intermediate_size=256, n_layers=8, n_heads=4, n_kv_heads=1, tie_embeddings=False),
    "fallbacks": dict(hidden_size=160, intermediate_size=288, n_layers=4, n_heads=2, n_kv_heads=1),
}
QWEN35_SHAPES = {  # transformers' Qwen3.5 settings over hybrid_fixtures' (3 Gated DeltaNet layers to 1 full attention)
    # every matrix 256 wide, untied, 4 query heads a key head; 8 layers: attn_qkv and attn_v both get more bits
    "qwen35-k-blocks": dict(hidden_size=256, intermediate_size=256, num_attention_heads=4, num_key_value_heads=1,
                            head_dim=64, linear_key_head_dim=64, linear_value_head_dim=64,
                            layer_types=[LINEAR, LINEAR, LINEAR, FULL] * 2, num_hidden_layers=8),
    # attn_qkv, attn_gate, ssm_alpha/beta, ffn_up/gate 256 wide beside fallbacks: attn_output and ssm_out
    # (64 wide: 4 heads of 16), ffn_down (288); tied
    "qwen35-fallbacks": dict(hidden_size=256, intermediate_size=288, tie_word_embeddings=True),
}


# the larger models' cases outside the slow ones; the small models run every case
FAST = {("q4_k_m", False), ("q5_k_m", True), ("q3_k_m", True), ("q2_k", False)}
CASES = [pytest.param(shape, mix, imatrix, id=f"{shape}-{mix}-{'imatrix' if imatrix else 'plain'}",
                      marks=[pytest.mark.slow] if shape.endswith("k-blocks") and (mix, imatrix) not in FAST else [])
         for shape in [*SHAPES, *QWEN35_SHAPES] for mix in MIXES for imatrix in (False, True)]


@pytest.fixture(scope="module")
def run(request, tmp_path_factory):
    ws = tmp_path_factory.mktemp(request.param) / "ws"
    if request.param in QWEN35_SHAPES:  # as tests/hf/test_gguf_qwen35.py builds its run: transformers' model, imported
        invoke("import", "--from", save_qwen35(ws.parent / "hf", seed=4, **QWEN35_SHAPES[request.param]),
               "--out", "run", "-w", ws)
    else:
        tok = make_tokenizer(ws.parent / "tok")
        write_checkpoint_run(ws, "run", tiny_model(tok.vocab_size, seed=4, max_seq_len=64, init_std=0.05,
                                                   **SHAPES[request.param]), tok)
    invoke("export", "--from", "run", "--format", "gguf", "--quant", "f16", "--to", ws.parent / "f16", "-w", ws,
           "--set", "probe=false")
    return ws, ws.parent / "f16" / "model-f16.gguf"


def gguf_tensors(path: Path) -> dict:
    return {t.name: (t.tensor_type.name, bytes(np.asarray(t.data).tobytes())) for t in gguf.GGUFReader(path).tensors}


def write_legacy_imatrix(path: Path, f16: Path) -> dict:
    """An importance matrix for every matrix of the file, as llama-imatrix's legacy .dat holds it."""
    rng = np.random.default_rng(7)
    entries = {t.name: (rng.random(int(t.shape[0])) ** 3 * 5).astype(np.float32)
               for t in gguf.GGUFReader(f16).tensors if len(t.shape) == 2 and t.name != "token_embd.weight"}
    blob = struct.pack("<i", len(entries))
    for name, values in entries.items():
        blob += struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", 1, values.size) + values.tobytes()
    path.write_bytes(blob)
    return entries


def llama_cpp_quantize(f16: Path, out: Path, mix: str, imatrix: dict | None = None) -> None:
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama.cpp's Python binding is not installed")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_" + MIXES[mix][0])
    params.nthread = 1  # the bytes do not depend on it; tests use one core
    if imatrix is not None:
        entries = (llama_cpp.llama_model_imatrix_data * (len(imatrix) + 1))()  # NULL-named entry ends it
        for entry, (name, values) in zip(entries, imatrix.items()):
            entry.name, entry.size = name.encode(), values.size
            entry.data = values.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        params.imatrix = entries
    assert llama_cpp.llama_model_quantize(str(f16).encode(), str(out).encode(), ctypes.byref(params)) == 0


@pytest.mark.parametrize("run, mix, imatrix", CASES, indirect=["run"])
def test_every_tensor_is_byte_identical_to_llama_cpps_quantiser(run, mix, imatrix, tmp_path):
    ws, f16 = run
    weights = write_legacy_imatrix(tmp_path / "imatrix.dat", f16) if imatrix else None
    llama_cpp_quantize(f16, tmp_path / "llama.gguf", mix, weights)
    args = ("--set", f"imatrix={tmp_path / 'imatrix.dat'}") if imatrix else ()
    invoke("export", "--from", "run", "--format", "gguf", "--quant", mix, "--to", tmp_path / "llmkit", "-w", ws,
           "--set", "probe=false", *args)
    theirs, ours = gguf_tensors(tmp_path / "llama.gguf"), gguf_tensors(tmp_path / "llmkit" / f"model-{mix}.gguf")
    assert sorted(theirs) == sorted(ours)
    assert {n: t for n, (t, _) in ours.items()} == {n: t for n, (t, _) in theirs.items()}
    assert [n for n in ours if ours[n][1] != theirs[n][1]] == []


@pytest.mark.parametrize("run", ["fallbacks"], indirect=True)
def test_an_unknown_quant_or_a_missing_imatrix_exits_2_naming_it(run, tmp_path):
    ws, _ = run
    r = invoke("export", "--from", "run", "--format", "gguf", "--quant", "q4_k_x", "-w", ws, code=2)
    assert "q4_k_x" in r.output and "q4_k_m" in r.output
    r = invoke("export", "--from", "run", "--format", "gguf", "--quant", "q4_k_m", "--to", tmp_path / "x", "-w", ws,
               "--set", f"imatrix={tmp_path / 'nowhere.dat'}", code=2)
    assert "nowhere.dat" in r.output
    r = invoke("export", "--from", "run", "--format", "gguf", "--quant", "q8_0", "-w", ws,
               "--set", f"imatrix={tmp_path / 'nowhere.dat'}", code=2)
    assert "imatrix" in r.output
