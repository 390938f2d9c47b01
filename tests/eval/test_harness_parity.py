"""llmkit's lm-eval LM against lm-eval's own `hf` backend on the folder `llmkit export` wrote, for a
tiny Llama (llmkit's sentencepiece tokenizer, <s> before a text) and a tiny Qwen2 (imported, its
byte-level BPE tokenizer, nothing before a text): the same per-request log-likelihoods to 1e-4,
the same generations, the same task results on a multiple-choice, a rolling-perplexity and a
generate-until task; and the demo's MMLU-style file gives llmkit's `choice` accuracy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from typer.testing import CliRunner

import llmkit
from llmkit.cli.app import build_app
from llmkit.eval.choice import ChoiceConfig, evaluate_choice
from llmkit.eval.harness import HarnessConfig, run_harness, shut_the_network, task_manager
from llmkit.eval.harness_lm import LlmkitLM
from llmkit.data.input_files import parse_questions
from llmkit.model.lm_scoring import LMScorer
from tests.tokenizers.test_tokenizer_json import QWEN25_TEMPLATE, QWEN_SPECIALS, save_folder, train_bpe
from tests.train.posttrain_fixtures import tiny_model, write_checkpoint_run

pytestmark = pytest.mark.usefixtures("one_thread")
DEMO = Path(__file__).parents[2] / "recipes/demo/data/eval"
runner = CliRunner()

ROLLING = """task: text_ppl
dataset_path: json
dataset_kwargs: {{data_files: {{test: {data}}}}}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list: [{{metric: word_perplexity}}, {{metric: byte_perplexity}}, {{metric: bits_per_byte}}]
"""
GENERATE = """task: text_gen
dataset_path: json
dataset_kwargs: {{data_files: {{test: {data}}}}}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{reference}}}}"
generation_kwargs: {{until: ["\\n", "."], max_gen_toks: 10, do_sample: false}}
metric_list: [{{metric: exact_match}}]
"""


def cli(*args):
    r = runner.invoke(build_app(), [str(a) for a in args])
    assert r.exit_code == 0, r.output


def llama_run(ws: Path, tok) -> None:
    model = tiny_model(tok.vocab_size, seed=1, init_std=0.3, max_seq_len=256)
    write_checkpoint_run(ws, "run", model, tok)


def qwen2_run(ws: Path, tok) -> None:
    backend = train_bpe(QWEN_SPECIALS)
    folder = save_folder(ws.parent / "qwen2", backend, QWEN25_TEMPLATE, eos_token="<|im_end|>",
                         pad_token="<|endoftext|>")
    config = transformers.Qwen2Config(vocab_size=backend.get_vocab_size(), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                      max_position_embeddings=256, tie_word_embeddings=True)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.3)  # spread logits: greedy tokens vary
    hf.save_pretrained(folder)
    cli("import", "--from", folder, "--out", "run", "-w", ws)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def backends(request, tok, tmp_path_factory):
    """(llmkit's LM on the run, lm-eval's hf backend on its export, a task folder)."""
    from lm_eval.models.huggingface import HFLM

    root = tmp_path_factory.mktemp(request.param)
    ws = root / "ws"
    (llama_run if request.param == "llama" else qwen2_run)(ws, tok)
    cli("export", "--from", "run", "-w", ws, "--to", root / "export")
    shut_the_network()
    model, tokenizer = llmkit.load(ws / "run")
    ours = LlmkitLM(model, tokenizer, device=torch.device("cpu"), batch_tokens=2048)
    theirs = HFLM(pretrained=str(root / "export"), batch_size=1, dtype="float32", device="cpu")
    tasks = root / "tasks"
    tasks.mkdir()
    texts = [json.loads(line)["prompt"] for line in (DEMO / "generation_en.jsonl").read_text().splitlines()]
    docs = root / "docs.jsonl"  # some longer than a 256-token window: several rolling windows
    docs.write_text("".join(json.dumps({"text": " ".join((texts[i:] + texts[:i]) * 2)[:60 + 700 * (i % 3)]}) + "\n"
                            for i in range(8)))
    (tasks / "ppl.yaml").write_text(ROLLING.format(data=docs))
    (tasks / "gen.yaml").write_text(GENERATE.format(data=DEMO / "generation_en.jsonl"))
    return ours, theirs, tasks


def harness_config(tasks: Path, names=("mmlu_local", "text_ppl", "text_gen"), **kw) -> HarnessConfig:
    return HarnessConfig(tasks=list(names), include_path=str(tasks),
                         data={"mmlu_local": str(DEMO / "mmlu_en_test.jsonl")},
                         fewshot_data={"mmlu_local": str(DEMO / "mmlu_en_dev.jsonl")}, **kw)


def instances(cfg: HarnessConfig, name: str, shots: int = 0) -> list:
    task = task_manager(cfg).load([name])["tasks"][name]
    task.set_config(key="num_fewshot", value=shots)
    task.build_all_requests(rank=0, world_size=1)
    return task.instances


def test_loglikelihoods_equal_the_hf_backend_per_request(backends):
    ours, theirs, tasks = backends
    requests = instances(harness_config(tasks), "mmlu_local", shots=2)
    mine, ref = ours.loglikelihood(requests), theirs.loglikelihood(requests)
    assert max(abs(a - b) for (a, _), (b, _) in zip(mine, ref)) <= 1e-4
    assert [g for _, g in mine] == [g for _, g in ref]
    rolling = instances(harness_config(tasks), "text_ppl")
    assert max(len(ours.tok_encode(r.args[0])) for r in rolling) > ours.max_length  # several windows
    mine, ref = ours.loglikelihood_rolling(rolling), theirs.loglikelihood_rolling(rolling)
    # a document's hundreds of tokens: hf sums their log-probabilities in float32 (ours: float64)
    assert mine == pytest.approx(ref, rel=1e-7, abs=1e-4)


def test_generations_equal_the_hf_backend(backends, monkeypatch):
    """The same tokens, stopped at the same place. A random model writes byte-fallback and
    unknown tokens, which sentencepiece and its tokenizer.json conversion spell differently (valid
    text they decode alike: tests/hf/test_export.py), so the Llama's text is read with transformers'
    decoder on both sides; Qwen2's byte-level BPE is one library on both sides."""
    ours, theirs, tasks = backends
    if ours.text_start:  # llmkit's sentencepiece tokenizer
        monkeypatch.setattr(ours.tok, "decode", lambda ids: theirs.tokenizer.decode(list(ids), skip_special_tokens=True))
    requests = instances(harness_config(tasks), "text_gen")
    mine, ref = ours.generate_until(requests), theirs.generate_until(requests)
    assert mine == ref and sum(bool(t) for t in mine) >= len(mine) // 2


@pytest.mark.slow  # two full lm-eval runs per family (~12 s each on an idle core)
def test_task_results_equal_the_hf_backend(backends):
    ours, theirs, tasks = backends
    cfg = harness_config(tasks, num_fewshot=1)
    mine = run_harness(ours, cfg)["results"]
    ref = run_harness(theirs, cfg)["results"]
    assert mine["mmlu_local"]["acc,none"] == ref["mmlu_local"]["acc,none"]
    assert mine["text_gen"]["exact_match,none"] == ref["text_gen"]["exact_match,none"]
    for metric in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
        assert mine["text_ppl"][metric] == pytest.approx(ref["text_ppl"][metric], rel=1e-6)


# one family is enough: this compares llmkit's two metrics, not the backends; llama's run (llmkit's
# own tokenizer) has the document-start token the `document` prompt start needs
@pytest.mark.parametrize("backends", ["llama"], indirect=True)
def test_the_demo_mmlu_file_gives_the_choice_metrics_accuracy(backends):
    """Started like llmkit's own metrics (`prompt_start=document`), lm-eval's MMLU prompt is
    `choice`'s letter format: the same accuracy; the C-Eval prompt differs only by the space
    lm-eval puts before the answer letter ("答案： A"; llmkit: "答案：A")."""
    ours, _, tasks = backends
    assert ours.text_start
    lm = LlmkitLM(ours._model, ours.tok, device=torch.device("cpu"), prompt_start="document")
    cfg = harness_config(tasks, ["mmlu_local", "ceval_local"], num_fewshot=0)
    cfg.data["ceval_local"] = str(DEMO / "ceval_zh_test.jsonl")
    harness = run_harness(lm, cfg)["results"]
    rows = [json.loads(line) for line in (DEMO / "mmlu_en_test.jsonl").read_text().splitlines()]
    choice = evaluate_choice(LMScorer(ours._model, device="cpu"), ours.tok, parse_questions(rows, "mmlu"),
                             ChoiceConfig(format="letter"))
    assert harness["mmlu_local"]["acc,none"] == choice["acc"]
    ceval = instances(cfg, "ceval_local")
    first = json.loads((DEMO / "ceval_zh_test.jsonl").read_text().splitlines()[0])
    assert ceval[0].args == (f"以下是中国关于{first['subject']}考试的单项选择题，请选出其中的正确答案。\n\n"
                             f"{first['question']}\nA. {first['A']}\nB. {first['B']}\nC. {first['C']}\n"
                             f"D. {first['D']}\n答案：", " A")
