"""`llmkit eval --tasks`: lm-evaluation-harness tasks on an llmkit run, offline; the shared-prefix
scorer against scoring each request alone; bad input exits 2 naming what is wrong."""

from __future__ import annotations

import contextlib
import json
import socket
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.eval.harness_scoring import PrefixScorer, clusters, distinct_inputs
from llmkit.model.lm_scoring import LMScorer
from tests.train.posttrain_fixtures import tiny_model, write_checkpoint_run

pytestmark = pytest.mark.usefixtures("one_thread")
DEMO = Path(__file__).parents[2] / "recipes/demo/data/eval"
runner = CliRunner()


@pytest.fixture(scope="module")
def ws(tok, tmp_path_factory):
    root = tmp_path_factory.mktemp("harness")
    write_checkpoint_run(root, "pretrain", tiny_model(tok.vocab_size, seed=1, init_std=0.3, max_seq_len=256), tok)
    return root


def llmkit_eval(ws, *args):
    return runner.invoke(build_app(), ["eval", "--from", "pretrain", "-w", str(ws), *map(str, args)])


def test_prefix_scorer_equals_scoring_each_request_alone(tok):
    model = tiny_model(tok.vocab_size, seed=2, init_std=0.3, max_seq_len=256).eval()
    shot = tok.encode("Question: 1 + 1 = ? Answer: 2. Question: 2 + 2 = ? Answer: 4. " * 2)
    requests = []
    for q in ["3 + 4", "5 + 6", "7 + 1"]:
        ctx = shot + tok.encode(f"Question: {q} = ? Answer:")
        for cont in (" 7", " 11", " 8 and more", " 12"):  # one-token and longer continuations
            requests.append((ctx + tok.encode(cont), len(tok.encode(cont))))
    requests.append((tok.encode("a short one"), 2))
    assert any(c.shared >= 24 for c in clusters(distinct_inputs(requests)))  # the prefix is reused
    ours = PrefixScorer(model, torch.device("cpu"), contextlib.nullcontext, batch_tokens=200).score(requests)
    alone = LMScorer(model, device="cpu", batch_tokens=1).target_logprobs(requests)
    assert max(abs(lp - ref) for (lp, _), ref in zip(ours, alone)) < 1e-4
    logits = model(torch.tensor([requests[0][0]]))[0, :-1].argmax(-1)
    n = requests[0][1]
    assert ours[0][1] == bool((logits[-n:] == torch.tensor(requests[0][0][-n:])).all())


def test_tasks_run_offline_and_land_in_the_artifact_and_the_report(ws, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("the network is shut in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    r = llmkit_eval(ws, "--tasks", "mmlu_reversal,cmmlu_reversal,ceval_local",
                    "--set", f"harness.data.ceval_local={DEMO / 'ceval_zh_test.jsonl'}",
                    "--set", f"harness.fewshot_data.ceval_local={DEMO / 'ceval_zh_dev.jsonl'}",
                    "--set", "harness.num_fewshot=1", "--set", "harness.limit=20")
    assert r.exit_code == 0, r.output
    results = json.loads((ws / "eval/pretrain/results.json").read_text())
    assert results["tasks"] == ["harness"]
    for task in ("mmlu_reversal", "cmmlu_reversal", "ceval_local"):
        metrics = results["harness"]["results"][task]
        assert 0 <= metrics["acc,none"] <= 1 and metrics["acc_stderr,none"] > 0
        assert results["harness"]["n-shot"][task] == 1
        assert results["harness"]["n-samples"][task]["effective"] == 20
    manifest = json.loads((ws / "eval/pretrain/manifest.json").read_text())
    assert manifest["stats"]["harness/cmmlu_reversal/acc_norm"] == results["harness"]["results"]["cmmlu_reversal"]["acc_norm,none"]
    assert any(str(DEMO / "ceval_zh_test.jsonl") in json.dumps(i) for i in manifest["inputs"])
    report = runner.invoke(build_app(), ["report", "eval/pretrain", "-w", str(ws)])
    assert report.exit_code == 0, report.output
    summary = (ws / "report/eval-pretrain/summary.md").read_text()
    assert "| pretrain | mmlu_reversal | acc |" in summary and "cmmlu_reversal" in summary


@pytest.mark.slow  # a name not among llmkit's tasks is looked up among lm-eval's 14,000 (~10 s idle)
def test_an_unknown_task_names_the_closest(ws):
    r = llmkit_eval(ws, "--tasks", "mmlu_locl")
    assert r.exit_code == 2 and "unknown task 'mmlu_locl'; did you mean mmlu_local" in r.output


def test_a_task_that_needs_the_network_is_refused(ws, tmp_path):
    (tmp_path / "hub.yaml").write_text("task: hub_task\ndataset_path: someone/their-dataset\ntest_split: test\n"
                                       "output_type: loglikelihood\ndoc_to_text: '{{q}}'\ndoc_to_target: '{{a}}'\n")
    r = llmkit_eval(ws, "--tasks", "hub_task", "--set", f"harness.include_path={tmp_path}")
    assert r.exit_code == 2
    assert "task hub_task reads the hub dataset 'someone/their-dataset', which needs the network" in r.output


def test_a_file_missing_a_column_names_it(ws, tmp_path):
    rows = [{"question": "q?", "choices": ["a", "b", "c", "d"]}]  # no answer
    bad = tmp_path / "mmlu.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = llmkit_eval(ws, "--tasks", "mmlu_local", "--set", f"harness.data.mmlu_local={bad}")
    assert r.exit_code == 2
    assert f"task mmlu_local: {bad} has no column 'answer'" in r.output and "Traceback" not in r.output


def test_a_format_task_without_its_file_says_which_set_to_give(ws):
    r = llmkit_eval(ws, "--tasks", "cmmlu_local")
    assert r.exit_code == 2 and "--set harness.data.cmmlu_local=FILE" in r.output
    r = llmkit_eval(ws, "--tasks", "mmlu_local", "--set", f"harness.data.mmlu_local={DEMO / 'mmlu_en_test.jsonl'}",
                    "--set", "harness.num_fewshot=2")
    assert r.exit_code == 2 and "--set harness.fewshot_data.mmlu_local=FILE" in r.output


def test_few_shot_examples_come_from_the_questions_subject_first():
    from llmkit.eval.harness_lm import SubjectFirstN

    pool = [{"q": i, "subject": s} for i, s in enumerate(["law", "math", "law", "math", "math", "art"])]
    sampler = SubjectFirstN(pool, rnd=0)
    assert [d["q"] for d in sampler.sample(3, eval_doc={"q": 9, "subject": "math"})] == [1, 3, 4]
    assert [d["q"] for d in sampler.sample(3, eval_doc={"q": 9, "subject": "law"})] == [0, 2, 1]
    assert [d["q"] for d in sampler.sample(2, eval_doc=pool[1])] == [3, 4]  # never the question itself
