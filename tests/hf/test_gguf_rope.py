"""RoPE scaling in GGUF files: tiny Llama and Qwen2 models built by transformers with linear or YaRN
scaling (YaRN with its default attention factor on Llama, with one set on Qwen2), trained until they recite 20 texts
from memory, imported and exported as f16 GGUF: the file holds the `rope.scaling.*` keys llama.cpp
reads; `llmkit import` of the file reads the scaling back, and so does transformers' reader in
export's probe; llama.cpp (its Python binding, skipped where it is not installed) continues prompts
whose tokens lie beyond the original context with `llmkit generate`'s greedy tokens on at least 19 of
20 prompts, parting only at near ties. What llama.cpp cannot compute (dynamic, longrope, YaRN with
other betas or without truncation) is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from typer.testing import CliRunner

import llmkit
from llmkit.cli.app import build_app
from llmkit.hf.folder import EXPORT_RECORD
from llmkit.hf.gguf_read import read_gguf_metadata
from llmkit.hf.gguf_rope import rope_scaling_refusal
from llmkit.model.config import ModelConfig
from llmkit.model.decoding import generate
from tests.hf.hybrid_fixtures import memorized
from tests.tokenizers.test_tokenizer_json import QWEN25_TEMPLATE, QWEN_SPECIALS, save_folder, train_bpe
from tests.train.posttrain_fixtures import task_sentences

pytestmark = pytest.mark.usefixtures("one_thread")
ORIGINAL = 32  # the original context: prompts run beyond it
PROMPT, NEW_TOKENS, PROMPTS = 44, 16, 20  # prompt tokens, then greedy ones: positions 44-59
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL}
CASES = {
    "llama-linear": ("LlamaConfig", {"rope_type": "linear", "factor": 4.0}),
    "llama-yarn": ("LlamaConfig", YARN),
    "qwen2-yarn-attention-factor": ("Qwen2Config", {**YARN, "attention_factor": 1.3}),
}


def invoke(*args):
    r = CliRunner().invoke(build_app(), [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r


def lessons() -> list[str]:
    sentences = task_sentences(30, seed=3)
    return [" ".join(sentences[4 * i:4 * i + 4]) for i in range(PROMPTS)]


@pytest.fixture(scope="module", params=list(CASES))
def exported(request, tmp_path_factory):
    """The imported run (model, its prompts as token lists) and its f16 GGUF file."""
    family, scaling = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    folder, ws = root / "hf", root / "ws"
    tokenizer = train_bpe(QWEN_SPECIALS)
    save_folder(folder, tokenizer, QWEN25_TEMPLATE, eos_token="<|im_end|>")
    texts = lessons()
    assert min(len(tokenizer.encode(t).ids) for t in texts) >= PROMPT + NEW_TOKENS
    torch.manual_seed(0)
    config = getattr(transformers, family)(
        vocab_size=tokenizer.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4 * ORIGINAL,
        rope_parameters={"rope_theta": 10000.0, **scaling}, tie_word_embeddings=False)
    hf = transformers.AutoModelForCausalLM.from_config(config).float()
    memorized(hf, tokenizer, texts, steps=160, lr=5e-3, length=PROMPT + NEW_TOKENS).save_pretrained(folder)
    invoke("import", "--from", folder, "--out", "run", "-w", ws)
    invoke("export", "--from", "run", "--format", "gguf", "--quant", "f16", "--to", root / "gguf", "-w", ws)
    record = json.loads((root / "gguf" / EXPORT_RECORD).read_text())
    model, tok = llmkit.load(ws / "run")
    prompts = [tokenizer.encode(t).ids[:PROMPT] for t in texts]
    answers = [tokenizer.encode(t).ids[PROMPT:PROMPT + NEW_TOKENS] for t in texts]
    return dict(name=request.param, scaling=scaling, model=model.eval(), prompts=prompts, answers=answers, record=record,
                path=root / "gguf" / "model-f16.gguf", ws=ws, root=root)


def test_the_file_holds_the_scaling_as_llama_cpp_reads_it_and_import_reads_it_back(exported):
    metadata = read_gguf_metadata(exported["path"])
    arch = metadata["general.architecture"]
    scaling = exported["scaling"]
    assert metadata[f"{arch}.rope.scaling.type"] == scaling["rope_type"]
    assert metadata[f"{arch}.rope.scaling.factor"] == scaling["factor"]
    if scaling["rope_type"] == "yarn":
        assert metadata[f"{arch}.rope.scaling.original_context_length"] == ORIGINAL
        # llama.cpp's magnitude is its own 0.1 ln(4) + 1 times this
        expected = scaling.get("attention_factor", 0.1 * torch.log(torch.tensor(4.0)).item() + 1) / (
            0.1 * torch.log(torch.tensor(4.0)).item() + 1)
        assert metadata[f"{arch}.rope.scaling.attn_factor"] == pytest.approx(expected, rel=1e-6)
    assert exported["record"]["max_abs_logit_diff"] < 1e-3  # transformers' reading of the file, in the probe
    invoke("import", "--from", exported["path"], "--out", "from_gguf", "-w", exported["ws"])
    model, _ = llmkit.load(exported["ws"] / "from_gguf")
    assert model.config.rope_scaling == exported["model"].config.rope_scaling
    assert model.config.max_seq_len == 4 * ORIGINAL


def llmkit_replies(model, prompts) -> list[list[int]]:
    with torch.no_grad():
        return [generate(model, torch.tensor([p]), NEW_TOKENS, greedy=True)[0, len(p):].tolist() for p in prompts]


def llama_cpp_replies(path: Path, prompts) -> list[list[int]]:
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama.cpp's Python binding is not installed")
    from llmkit.eval.efficiency import greedy_llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=4 * ORIGINAL, n_threads=1, n_threads_batch=1, verbose=False)
    try:
        return [greedy_llama_cpp(llm, p, NEW_TOKENS) for p in prompts]
    finally:
        llm.close()


def top_two(model, ids: list[int]) -> tuple[float, float]:
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0, -1].float()
    best = logits.topk(2).values
    return float(best[0] - best[1]), float(logits.abs().max())


def test_llama_cpp_continues_beyond_the_original_context_as_llmkit(exported):
    """Token for token on 19 of 20 prompts at least (positions 44-59 of an original context of 32);
    where a reply parts, the fp32 run's two best next tokens are within 1% of its largest logit."""
    model, prompts = exported["model"], exported["prompts"]
    ours, theirs = llmkit_replies(model, prompts), llama_cpp_replies(exported["path"], prompts)
    parting = [(p, a, next(i for i, (x, y) in enumerate(zip(a, b)) if x != y))
               for p, a, b in zip(prompts, ours, theirs) if a != b]
    gaps = [top_two(model, p + a[:i]) for p, a, i in parting]
    assert len(parting) <= PROMPTS // 20, (exported["name"], gaps)
    assert all(gap < 0.01 * largest for gap, largest in gaps), (exported["name"], gaps)
    # the model recites what it learnt (a margin rounding does not decide), so a scaling written wrong
    # would show as replies that part early
    assert sum(a == r for a, r in zip(ours, exported["answers"])) >= PROMPTS - 5, exported["name"]


@pytest.mark.parametrize("scaling, named", [
    ({"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 32}, "dynamic (NTK)"),
    ({"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 32, "short_factor": [1.0] * 8,
      "long_factor": [2.0] * 8}, "longrope"),
    ({**YARN, "beta_fast": 16}, "beta_fast / beta_slow"),
    ({**YARN, "truncate": False}, "truncate: false"),
    ({**YARN, "mscale": 1.0, "mscale_all_dim": 0.5}, "mscale"),
])
def test_what_llama_cpp_cannot_compute_is_refused_by_name(scaling, named):
    assert named in rope_scaling_refusal(ModelConfig(hidden_size=64, n_heads=4, rope_scaling=scaling))


def test_linear_and_yarn_with_its_defaults_are_written():
    for scaling in ({"rope_type": "linear", "factor": 2.0}, YARN, {**YARN, "attention_factor": 1.1}):
        assert rope_scaling_refusal(ModelConfig(hidden_size=64, n_heads=4, rope_scaling=scaling)) is None
