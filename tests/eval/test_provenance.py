"""`llmkit eval` warns when the evaluated model's training data was never decontaminated against
the file it is scored on, and not when it was (the content counts, not the file's name); an
lm-eval task (`--tasks`) gets a note either way, naming the decontaminate artifact or the route."""

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.data.io import DatasetWriter
from llmkit.eval.harness import SHIPPED
from llmkit.eval.provenance import contamination_warnings, harness_notes
from llmkit.core.workspace import Artifact, Workspace
from tests.train.posttrain_fixtures import tiny_model, write_checkpoint_run

EVAL_DATA = Path(__file__).resolve().parents[2] / "recipes" / "demo" / "data" / "eval"
MMLU, CEVAL = EVAL_DATA / "mmlu_en_test.jsonl", EVAL_DATA / "ceval_zh_test.jsonl"
WARNING = "warning: not decontaminated"
REVERSAL = SHIPPED / "data" / "mmlu_reversal_test.jsonl"  # what the shipped task mmlu_reversal scores


def llmkit(*args):
    r = CliRunner().invoke(build_app(), [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r


def dataset(root: Path, name: str, texts: list[str]) -> None:
    b = Workspace(root).builder(name, stage="ingest", config={}, quiet=True)
    with b:
        writer = DatasetWriter(b.dir)
        writer.write(pa.Table.from_pylist([{"id": f"{name}{i}", "text": t, "source": name}
                                           for i, t in enumerate(texts)]))
        writer.close()


def trained_on(root: Path, run: str, tok, *inputs: str) -> None:
    """A checkpoint run whose manifest says it learned from `inputs` (as a trainer lists them)."""
    write_checkpoint_run(root, run, tiny_model(tok.vocab_size, seed=1), tok)
    manifest = json.loads((root / run / "manifest.json").read_text())
    manifest["inputs"] = [{"path": name, "fingerprint": Artifact.open(root / name).fingerprint}
                          for name in inputs]
    (root / run / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def ws(tmp_path_factory, tok):
    """Two pretrained runs: one on tokens of a corpus decontaminated against MMLU's file and
    mmlu_reversal's, one on
    tokens of the same corpus as it was; and an SFT run on top of the clean one."""
    root = tmp_path_factory.mktemp("provenance") / "ws"
    dataset(root, "docs", [f"Document {i} tells of rivers and gardens in spring." for i in range(40)])
    dataset(root, "sft_data", ["Question: what grows in spring? Answer: gardens."] * 8)
    dataset(root, "sft_heldout", ["held out"] * 4)
    b = Workspace(root).builder("tokenizer", stage="tokenizer", config={}, quiet=True)
    with b:
        tok.save(b.dir)
    llmkit("decontaminate", "-w", root, "--in", "docs", "--against", f"{MMLU},{REVERSAL}")
    for data, tokens in (("decontaminated", "tokens_clean"), ("docs", "tokens_raw")):
        llmkit("tokenize", "-w", root, "--in", data, "--out", tokens, "--set", "val_fraction=0.1")
    trained_on(root, "clean_model", tok, "tokens_clean", "tokenizer")
    trained_on(root, "raw_model", tok, "tokens_raw", "tokenizer")
    trained_on(root, "sft_model", tok, "clean_model", "sft_data", "sft_heldout")
    return root


def evaluate(root: Path, run: str, *files: Path):
    r = llmkit("eval", "-w", root, "--from", run, "--out", f"{run}-{len(files)}",
               "--set", "tasks=choice", "--set", "choice.max_questions=2",
               "--set", f"choice.files={','.join(map(str, files))}")
    return r.output, json.loads((root / "eval" / f"{run}-{len(files)}" / "manifest.json").read_text())


def test_eval_warns_on_a_model_trained_on_undecontaminated_tokens(ws):
    output, manifest = evaluate(ws, "raw_model", MMLU)
    assert WARNING in output and "mmlu_en_test" in output
    assert "raw_model <- tokens_raw <- docs" in manifest["stats"][WARNING]


def test_eval_does_not_warn_when_the_tokens_were_decontaminated_against_the_file(ws):
    output, manifest = evaluate(ws, "clean_model", MMLU)
    assert WARNING not in output and WARNING not in manifest["stats"]


def test_the_warning_names_only_the_files_left_out(ws):
    _, manifest = evaluate(ws, "clean_model", MMLU, CEVAL)
    assert "ceval_zh_test (clean_model <- tokens_clean <- decontaminated <- docs)" in \
        manifest["stats"][WARNING]
    assert "mmlu_en_test" not in manifest["stats"][WARNING]


def test_a_copy_of_the_file_counts_an_edited_one_does_not(ws, tmp_path):
    run = Artifact.open(ws / "clean_model", ws)
    copy = tmp_path / "renamed.jsonl"
    shutil.copy(MMLU, copy)
    assert contamination_warnings(run, [_file(copy)]) == {}
    copy.write_text(MMLU.read_text() + MMLU.read_text().splitlines()[0] + "\n")
    assert "renamed" in contamination_warnings(run, [_file(copy)])[WARNING]


def test_fine_tuning_data_counts_but_a_held_out_set_does_not(ws):
    warnings = contamination_warnings(Artifact.open(ws / "sft_model", ws), [_file(MMLU)])
    assert "sft_model <- sft_data" in warnings[WARNING] and "sft_heldout" not in warnings[WARNING]


def test_each_harness_task_says_whether_its_scored_file_was_decontaminated(ws):
    notes = {}
    for run in ("clean_model", "raw_model"):
        r = llmkit("eval", "-w", ws, "--from", run, "--out", f"{run}-harness", "--tasks",
                   "mmlu_reversal,cmmlu_reversal", "--set", "harness.limit=2")
        notes[run] = json.loads((ws / "eval" / f"{run}-harness" / "manifest.json").read_text())["stats"]
        assert "harness/mmlu_reversal/decontaminated" in r.output  # the summary says it
    assert notes["clean_model"]["harness/mmlu_reversal/decontaminated"] == \
        "yes — mmlu_reversal_test.jsonl checked by decontaminated"
    assert notes["raw_model"]["harness/mmlu_reversal/decontaminated"].startswith(
        "no — mmlu_reversal_test.jsonl (raw_model <- tokens_raw <- docs)")
    assert notes["clean_model"]["harness/cmmlu_reversal/decontaminated"].startswith(  # not an --against
        "no — cmmlu_reversal_test.csv (clean_model <- tokens_clean <- decontaminated <- docs)")
    llmkit("report", "-w", ws, "eval/clean_model-harness")
    summary = (ws / "report" / "eval-clean_model-harness" / "summary.md").read_text()
    assert "- clean_model-harness / mmlu_reversal: yes — mmlu_reversal_test.jsonl checked by decontaminated" \
        in summary


def test_an_imported_model_or_untraceable_data_is_said_so(ws, tmp_path):
    imported = Artifact(tmp_path / "smol", {"stage": "import", "fingerprint": "f", "inputs": []})
    notes = harness_notes(imported, {"mmlu_reversal": [str(REVERSAL)], "from_cache": None})
    assert notes["harness/mmlu_reversal/decontaminated"].startswith(
        "no — mmlu_reversal_test.jsonl (smol (imported: trained outside the workspace))")
    assert notes["harness/from_cache/decontaminated"].startswith("unknown — ")


def _file(path: Path) -> Artifact:
    from llmkit.data.input_files import eval_input

    return eval_input(Workspace(path.parent), str(path))
