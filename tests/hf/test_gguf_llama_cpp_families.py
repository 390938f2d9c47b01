"""llama.cpp runs the GGUF files of the families whose layout only it reads (transformers reads no
`qwen35` or `smollm3` GGUF file): a tiny random Qwen3.5 (three Gated DeltaNet layers, one gated
full-attention layer, two value heads per key head, partial rotary) and a tiny random SmolLM3 (the
4th layer without RoPE), built by transformers' own classes and imported, exported as f16 and q8_0
and loaded by llama.cpp's Python binding (`make llama-cpp`; skipped where it is not installed):
its tokenization of the prompts equals llmkit's; from the f16 file its greedy tokens equal `llmkit
generate`'s on at least 19 of 20 prompts, parting only at near ties, and the q8_0 file decodes them
as llmkit's on at least 19 of 20 too, in a file of the same tensor types and size as llama.cpp's
own q8_0 of the f16 file. The models first learn 20 short texts by heart and are prompted with
their first words, the reply staying inside what they learnt: a random model's next tokens are so
near a tie that any rounding decides them (replies that ran past the learnt span parted from fp32
on 5-9 of 20 prompts in the q8_0 files, llama.cpp's own as well)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import llmkit
from llmkit.cli.app import build_app
from llmkit.model.decoding import generate
from tests.hf.hybrid_fixtures import LEARNT_TOKENS, save_qwen35, save_smollm3
from tests.train.posttrain_fixtures import task_sentences

pytest.importorskip("llama_cpp", reason="llama.cpp's Python binding is not installed: `make llama-cpp` builds it")

NEW_TOKENS = 24
PROMPTS = 20
pytestmark = pytest.mark.usefixtures("one_thread")


def invoke(*args):
    r = CliRunner().invoke(build_app(), [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r


def lessons() -> list[str]:
    """What the models learn by heart (their first LEARNT_TOKENS): 20 texts of three task sentences each."""
    sentences = task_sentences(PROMPTS, seed=7)
    return [" ".join(sentences[3 * i:3 * i + 3]) for i in range(PROMPTS)]


def prompt_texts() -> list[str]:
    """Each lesson's first four words: the model continues it from memory."""
    return [" ".join(text.split(" ")[:4]) for text in lessons()]


TOKENIZED = ["The quick brown fox, café naïve — 1234567!\n\n  tabs\tand  spaces",
             "<|im_start|>user\nWhat is 3+4?<|im_end|>\n"]  # beside the lessons and prompts


@pytest.fixture(scope="module", params=["qwen35", "smollm3"])
def exported(request, tmp_path_factory):
    """The imported run (llmkit model, tokenizer), its prompts as llmkit encodes them, its f16 and q8_0 files."""
    root = tmp_path_factory.mktemp(request.param)
    save = save_qwen35 if request.param == "qwen35" else save_smollm3
    ws = root / "ws"
    invoke("import", "--from", save(root / "hf", lessons()), "--out", "run", "-w", ws)
    files = {}
    for quant in ("f16", "q8_0"):
        invoke("export", "--from", "run", "--format", "gguf", "--quant", quant, "--to", root / quant, "-w", ws)
        files[quant] = root / quant / f"model-{quant}.gguf"
    model, tokenizer = llmkit.load(ws / "run")
    texts = prompt_texts()
    prompts = [tokenizer.encode(t) for t in texts]
    assert max(map(len, prompts)) + NEW_TOKENS <= LEARNT_TOKENS <= min(len(tokenizer.encode(t)) for t in lessons())
    return dict(name=request.param, model=model.eval(), tokenizer=tokenizer, texts=texts, prompts=prompts, **files)


def open_llama(path: Path):
    import llama_cpp

    return llama_cpp.Llama(model_path=str(path), n_ctx=256, n_threads=1, n_threads_batch=1, verbose=False)


def llmkit_replies(model, prompts) -> list[list[int]]:
    with torch.no_grad():
        return [generate(model, torch.tensor([p]), NEW_TOKENS, greedy=True)[0, len(p):].tolist() for p in prompts]


def llama_cpp_replies(path: Path, prompts) -> list[list[int]]:
    from llmkit.eval.efficiency import greedy_llama_cpp

    llm = open_llama(path)
    try:
        return [greedy_llama_cpp(llm, p, NEW_TOKENS) for p in prompts]
    finally:
        llm.close()


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def top_two(model, ids: list[int]) -> tuple[float, float]:
    """(how far the likeliest next token's logit is ahead of the second's, the largest |logit|) in the fp32 run."""
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0, -1].float()
    best = logits.topk(2).values
    return float(best[0] - best[1]), float(logits.abs().max())


def test_llama_cpp_tokenizes_the_prompts_as_llmkit(exported):
    llm = open_llama(exported["f16"])
    try:
        texts = exported["texts"] + lessons() + TOKENIZED
        theirs = [llm.tokenize(t.encode(), add_bos=False, special=True) for t in texts]
    finally:
        llm.close()
    assert theirs == [exported["tokenizer"].encode(t) for t in texts]


def differing_replies(exported, path: Path) -> list[tuple[list[int], list[int], int]]:
    """(prompt, llmkit's reply, where llama.cpp's parts) for each reply llama.cpp decodes otherwise."""
    ours = llmkit_replies(exported["model"], exported["prompts"])
    theirs = llama_cpp_replies(path, exported["prompts"])
    return [(p, a, i) for p, a, b in zip(exported["prompts"], ours, theirs) if (i := first_difference(a, b)) is not None]


def assert_decoded_as_llmkit(exported, path: Path):
    """Token for token on 19 of 20 prompts at least; where a reply parts, the fp32 run's two best
    next tokens there are within 1% of its largest logit (llama.cpp rounds the activations that meet
    f16 weights to f16, q8_0 weights to 8 bits)."""
    differing = differing_replies(exported, path)
    assert len(differing) <= PROMPTS // 20, (exported["name"], [(i, top_two(exported["model"], p + a[:i]))
                                                                for p, a, i in differing])
    for prompt, reply, i in differing:
        gap, largest = top_two(exported["model"], prompt + reply[:i])
        assert gap < 0.01 * largest, (exported["name"], i, gap, largest)


def test_llama_cpp_decodes_the_f16_file_as_llmkit_generate_decodes_the_run(exported):
    """A wrong layout (a norm without its +1, value heads in the wrong order, RoPE on the wrong layer)
    diverges at once and everywhere. Measured: Qwen3.5 and SmolLM3 20 of 20."""
    assert_decoded_as_llmkit(exported, exported["f16"])


def test_llama_cpp_decodes_the_q8_0_file_as_llmkit_generate_decodes_the_run(exported):
    """The q8_0 file decodes llmkit's replies as the f16 file does (measured: Qwen3.5 and SmolLM3
    20 of 20), and it is what llama.cpp's own quantiser (`llama_model_quantize`) makes of the f16
    file: the same tensor types and size."""
    import ctypes

    import gguf
    import llama_cpp

    assert_decoded_as_llmkit(exported, exported["q8_0"])
    own = exported["f16"].parent / "llama-cpp-q8_0.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, 1
    assert llama_cpp.llama_model_quantize(str(exported["f16"]).encode(), str(own).encode(), ctypes.byref(params)) == 0
    types = [{t.name: t.tensor_type for t in gguf.GGUFReader(f).tensors} for f in (exported["q8_0"], own)]
    assert types[0] == types[1] and exported["q8_0"].stat().st_size == own.stat().st_size
