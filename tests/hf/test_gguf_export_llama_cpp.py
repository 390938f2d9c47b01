"""llama.cpp as the real client of `llmkit export --format gguf`: its Python binding (llama-cpp-python,
built by `make llama-cpp`; the tests skip where it is not installed) loads the f16 and q8_0 files of a
tiny llmkit model and of SmolLM2-135M-Instruct (the smollm2 recipe's imported run, where it exists):
the f16 file greedy-decodes `llmkit generate`'s tokens (but at near ties), the q8_0 file decodes the
f16 file's as often as llama.cpp's own q8_0 of it does; `llmkit eval` measures a GGUF file through it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import llmkit
from llmkit.cli.app import build_app
from llmkit.model.decoding import generate
from llmkit.generation import encode_prompt
from llmkit.hf.ship_check import first_difference, top_two_gap
from tests.train.posttrain_fixtures import make_tokenizer, task_sentences, tiny_model, write_checkpoint_run

pytest.importorskip("llama_cpp", reason="llama.cpp's Python binding is not installed: `make llama-cpp` builds it")

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = ROOT / "workspace-smollm2" / "smollm2"  # read only: exported from, never written
PROMPTS = ROOT / "recipes" / "smollm2" / "general_prompts.jsonl"
NEW_TOKENS = 32

pytestmark = pytest.mark.usefixtures("one_thread")


def invoke(*args):
    r = CliRunner().invoke(build_app(), [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r


def tiny_run(ws: Path) -> None:
    tok = make_tokenizer(ws.parent / "tok")
    # weights wider than the usual tiny init: a random model's next-token distribution is then
    # peaked enough that f16's rounding does not turn a near tie into another greedy token
    write_checkpoint_run(ws, "run", tiny_model(tok.vocab_size, seed=3, hidden_size=64, intermediate_size=128,
                                               max_seq_len=256, init_std=0.3), tok)


@pytest.fixture(scope="module", params=["tiny", "smollm2"])
def exported(request, tmp_path_factory):
    """The run (llmkit model, tokenizer, prompts as ids) and its f16 and q8_0 GGUF files."""
    ws = tmp_path_factory.mktemp(request.param) / "ws"
    if request.param == "smollm2":
        if not (SMOLLM2 / "manifest.json").is_file():
            pytest.skip(f"{SMOLLM2} not built (`make smollm2` imports it)")
        ws.mkdir()
        (ws / "run").symlink_to(SMOLLM2)
    else:
        tiny_run(ws)
    files = {}
    for quant in ("f16", "q8_0"):
        out = ws.parent / quant
        invoke("export", "--from", "run", "--format", "gguf", "--quant", quant, "--to", out, "-w", ws,
               "--set", "probe=false")
        files[quant] = out / f"model-{quant}.gguf"
    model, tokenizer = llmkit.load(ws / "run")
    if request.param == "smollm2":
        texts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines()[:20]]
    else:
        texts = task_sentences(8, seed=5)
    chat = request.param == "smollm2"  # an instruct model is prompted as `llmkit generate` prompts it
    prompts = [encode_prompt(tokenizer, t, chat) for t in texts]
    return dict(name=request.param, model=model.eval(), tokenizer=tokenizer, prompts=prompts, **files)


def until_stop(ids: list[int], stop_ids) -> list[int]:
    """The reply as `llmkit generate` returns it: up to and including the first stop token."""
    end = next((i for i, t in enumerate(ids) if t in stop_ids), None)
    return ids if end is None else ids[:end + 1]


def llmkit_replies(model, tokenizer, prompts) -> list[list[int]]:
    with torch.no_grad():
        return [until_stop(generate(model, torch.tensor([p]), NEW_TOKENS, greedy=True)[0, len(p):].tolist(),
                           set(tokenizer.stop_ids)) for p in prompts]


def llama_cpp_replies(path: Path, prompts, stop_ids) -> list[list[int]]:
    import llama_cpp

    from llmkit.eval.efficiency import greedy_llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, n_threads=1, n_threads_batch=1, verbose=False)
    try:
        return [until_stop(greedy_llama_cpp(llm, p, NEW_TOKENS), stop_ids) for p in prompts]
    finally:
        llm.close()


def test_llama_cpp_decodes_the_f16_file_as_llmkit_generate_decodes_the_run(exported):
    """Token for token, except where the run's own two best next tokens are a near tie: llama.cpp
    rounds the activations that meet f16 weights to f16 (~0.1 on SmolLM2's logits, which reach 37),
    which may pick the other one (measured: SmolLM2 19 of 20 replies equal, the other parts at a gap
    of 0.005; the tiny model 22 of 24, gaps 0.004 and 0.008). A wrong layout or tokenizer diverges
    at once and everywhere."""
    stop = set(exported["tokenizer"].stop_ids)
    ours = llmkit_replies(exported["model"], exported["tokenizer"], exported["prompts"])
    theirs = llama_cpp_replies(exported["f16"], exported["prompts"], stop)
    assert sum(map(len, ours)) >= len(ours) * 4  # replies, not stops at once
    differing = [(p, a, i) for p, a, b in zip(exported["prompts"], ours, theirs)
                 if (i := first_difference(a, b)) is not None]
    assert len(differing) <= 0.1 * len(ours), (exported["name"], len(differing))
    for prompt, reply, i in differing:
        assert top_two_gap(exported["model"], prompt + reply[:i]) < 0.01, (exported["name"], i)


def test_llama_cpp_decodes_the_q8_0_file_as_closely_as_its_own_q8_0(exported):
    """The q8_0 file against what llama.cpp's own quantiser (`llama_model_quantize`) makes of the
    f16 file: the same size and tensor types, and its greedy replies equal f16's on as many prompts
    (one fewer at most). Neither equals f16 everywhere: llama.cpp's q8_0 products round the
    activations to 8 bits as well (SmolLM2: ours 18 of 20, llama.cpp's own 16; a random tiny model,
    whose next-token gaps are below that rounding, 4 and 5 of 24)."""
    import ctypes

    import gguf
    import llama_cpp

    own = exported["f16"].parent / "llama-cpp-q8_0.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, 1
    assert llama_cpp.llama_model_quantize(str(exported["f16"]).encode(), str(own).encode(), ctypes.byref(params)) == 0
    types = [{t.name: t.tensor_type for t in gguf.GGUFReader(f).tensors} for f in (exported["q8_0"], own)]
    assert types[0] == types[1] and exported["q8_0"].stat().st_size == own.stat().st_size

    stop = set(exported["tokenizer"].stop_ids)
    f16 = llama_cpp_replies(exported["f16"], exported["prompts"], stop)
    equal = [sum(a == b for a, b in zip(f16, llama_cpp_replies(f, exported["prompts"], stop)))
             for f in (exported["q8_0"], own)]
    assert equal[0] >= equal[1] - 1, (exported["name"], equal)
    assert exported["q8_0"].stat().st_size < 0.6 * exported["f16"].stat().st_size


def test_eval_measures_a_gguf_file_through_llama_cpp(tmp_path):
    ws = tmp_path / "ws"
    tiny_run(ws)
    invoke("export", "--from", "run", "--format", "gguf", "--quant", "q8_0", "-w", ws, "--set", "probe=false")
    gguf = ws / "export" / "gguf-q8_0" / "model-q8_0.gguf"
    invoke("eval", "--from", "run", "-w", ws, "--set", "tasks=efficiency", "--set", "efficiency.batch_sizes=2",
           "--set", "efficiency.prompt_tokens=8", "--set", "efficiency.new_tokens=4",
           "--set", f"efficiency.models={gguf},{ws / 'export' / 'gguf-q8_0'}")
    results = json.loads((ws / "eval" / "run" / "results.json").read_text())["efficiency"]["models"]
    by_file, by_folder = results[str(gguf)], results[str(ws / "export" / "gguf-q8_0")]
    for form in (by_file, by_folder):
        assert form["engine"] == "llama.cpp" and form["size"]["file_bytes"] == gguf.stat().st_size
        [run] = form["runs"]
        # served in turn: the second request waits for the first
        assert run["request_latency_p95_s"] > run["request_latency_p50_s"] > 0
