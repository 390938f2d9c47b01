import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.model.reward_model import RewardModel
from tests.conftest import write_jsonl
from tests.eval.conftest import tokenize_rows
from tests.train.posttrain_fixtures import (preference_rows, task_sentences, tiny_model,
                                            write_checkpoint_run)

EVAL_DATA = Path(__file__).resolve().parents[2] / "recipes" / "demo" / "data" / "eval"


def llmkit(*args):
    return CliRunner().invoke(build_app(), [str(a) for a in args])


@pytest.fixture(scope="module")
def ws(tmp_path_factory, tok):
    """A policy run, a reference run, a reward model, token shards, preference and prompt files."""
    tmp = tmp_path_factory.mktemp("eval")
    root = tmp / "ws"
    write_checkpoint_run(root, "pretrain", tiny_model(tok.vocab_size, seed=1), tok)
    write_checkpoint_run(root, "ref", tiny_model(tok.vocab_size, seed=2), tok)
    rm = RewardModel(tiny_model(tok.vocab_size, seed=3))
    write_checkpoint_run(root, "rm", rm, tok, config=rm.checkpoint_config())
    tokenize_rows(root, tok, [{"id": f"d{i}", "text": t, "source": "tasks"}
                              for i, t in enumerate(task_sentences(4))], val_fraction=0.5)
    prefs = write_jsonl(tmp / "prefs.jsonl", preference_rows(6))
    prompts = write_jsonl(tmp / "prompts.jsonl", [{"prompt": r["prompt"]} for r in preference_rows(3, seed=1)])
    return root, prefs, prompts


ALL_TASKS = ["--set", "tasks=ppl,choice,generation,reward,efficiency",
             "--set", f"choice.files={EVAL_DATA / 'mmlu_en_test.jsonl'},{EVAL_DATA / 'ceval_zh_test.jsonl'}",
             "--set", f"choice.dev_files={EVAL_DATA / 'mmlu_en_dev.jsonl'},{EVAL_DATA / 'ceval_zh_dev.jsonl'}",
             "--set", "choice.shots=1", "--set", "choice.max_questions=8",
             "--set", f"generation.files={EVAL_DATA / 'generation_en.jsonl'},{EVAL_DATA / 'generation_zh.jsonl'}",
             "--set", "generation.max_new_tokens=4", "--set", "generation.max_examples=3",
             "--set", "reward.model=rm", "--set", "reward.reference=ref", "--set", "reward.max_new_tokens=4",
             "--set", "efficiency.batch_sizes=1,2", "--set", "efficiency.prompt_tokens=8",
             "--set", "efficiency.new_tokens=4", "--set", "efficiency.repeats=1", "--set", "ppl.window=32"]


def test_every_task_reports_into_results_json_and_the_manifest(ws):
    root, prefs, prompts = ws
    args = ["eval", "-w", root, "--from", "pretrain", *ALL_TASKS,
            "--set", f"reward.preferences={prefs}", "--set", f"reward.prompts={prompts}"]
    r = llmkit(*args)
    assert r.exit_code == 0, r.output
    out = root / "eval" / "pretrain"
    results = json.loads((out / "results.json").read_text())
    assert results["step"] == "step-00000001"
    assert set(results) == {"run", "step", "tasks", "ppl", "choice", "generation", "reward", "efficiency"}
    assert set(results["ppl"]["tokens:val"]) >= {"ppl", "nll_per_token", "tokens", "docs"}
    val = json.loads((root / "tokens" / "manifest.json").read_text())["stats"]["splits"]["val"]
    ppl = results["ppl"]["tokens:val"]
    assert (ppl["tokens"], ppl["docs"]) == (val["tokens"], val["docs"])  # every token, </s> included
    assert set(results["choice"]) == {"mmlu_en_test", "ceval_zh_test"}
    zh = results["choice"]["ceval_zh_test"]
    assert zh["questions"] == 8 and zh["shots"] == 1 and set(zh["by_subject"]) <= {"古诗", "常识", "数学", "地理"}
    assert set(results["generation"]) == {"generation_en", "generation_zh"}
    assert set(results["generation"]["generation_zh"]) == {"zh"}
    assert set(results["reward"]["pairwise"]) == {"accuracy", "mean_margin", "pairs"}
    assert results["reward"]["win_rate"]["prompts"] == 3
    assert [run["batch_size"] for run in results["efficiency"]["runs"]] == [1, 2]
    assert len((out / "generations-generation_zh.jsonl").read_text().splitlines()) == 3
    assert len((out / "win-rate.jsonl").read_text().splitlines()) == 3
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stats"]["ppl/tokens:val"] == results["ppl"]["tokens:val"]["ppl"]
    assert manifest["stats"]["choice/mmlu_en_test/acc"] == results["choice"]["mmlu_en_test"]["acc"]
    assert {Path(i["path"]).name for i in manifest["inputs"]} == {
        "pretrain", "tokens", "rm", "ref", "prefs.jsonl", "prompts.jsonl", "mmlu_en_test.jsonl",
        "ceval_zh_test.jsonl", "mmlu_en_dev.jsonl", "ceval_zh_dev.jsonl", "generation_en.jsonl",
        "generation_zh.jsonl"}
    assert "mmlu_en_test" in r.output  # the printed table
    again = llmkit(*args)
    assert again.exit_code == 0 and "up to date" in again.output
    prefs.write_text(prefs.read_text() + json.dumps(preference_rows(1, seed=9)[0]) + "\n")
    assert "up to date" not in llmkit(*args).output  # an edited eval file makes the report stale


def test_a_step_folder_and_an_out_name(ws):
    root, _, _ = ws
    r = llmkit("eval", "-w", root, "--from", "ref/step-00000001", "--out", "ref-step1", "--set", "tokens=tokens")
    assert r.exit_code == 0, r.output
    config = json.loads((root / "eval" / "ref-step1" / "manifest.json").read_text())["config"]
    assert config["step"] == "step-00000001" and config["tasks"] == ["ppl"]


@pytest.mark.parametrize("sets,message", [
    (["tasks=choice"], "choice.files"),
    (["tasks=reward", "reward.model=rm"], "reward.preferences"),
    (["tasks=ppl,speed"], "speed"),
    (["tasks=choice", "choice.files=nowhere.jsonl"], "nowhere.jsonl: no such file"),
])
def test_incomplete_settings_exit_2_naming_what_is_missing(ws, sets, message):
    root, _, _ = ws
    r = llmkit("eval", "-w", root, "--from", "pretrain", *[a for s in sets for a in ("--set", s)])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output


def test_the_headline_carries_bits_per_byte_of_texts_so_ablate_can_compare_tokenizers():
    from llmkit.eval.stage import headline

    flat = headline({"ppl": {"tokens:val": {"ppl": 9.0}, "zh_heldout": {"ppl": 40.0, "bits_per_byte": 3.5}}})
    assert flat == {"ppl/tokens:val": 9.0, "ppl/zh_heldout": 40.0, "ppl/zh_heldout/bits_per_byte": 3.5}
