"""`llmkit synth` as a command on a tiny random model: an ordinary dataset with its provenance,
conservation, up to date on a second run, byte-identical after a SIGKILL and a rerun, and exit 2
naming what is wrong in the command."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.data.chat import conversation
from llmkit.data.io import dataset_files, read_table
from tests.train.posttrain_fixtures import tiny_model, write_checkpoint_run, write_dataset

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see tests/conftest.py
REPO = Path(__file__).resolve().parents[2]
FAST = ["--set", "max_new_tokens=6", "--set", "keep_truncated=true", "--set", "rows_per_task=2",
        "--set", "batch_size=4"]


@pytest.fixture(scope="module")
def ws(tmp_path_factory, tok):
    root = tmp_path_factory.mktemp("ws")
    write_checkpoint_run(root, "tiny", tiny_model(tok.vocab_size, seed=3), tok)
    write_dataset(root, "prompts", [{"id": f"p{i}", "prompt": f"What is {i}+{i}?", "answer": str(2 * i)}
                                    for i in range(7)])
    write_dataset(root, "docs", [{"id": "d0", "body": "a document"}])  # no prompt, no messages
    return root


def synth(ws, *args):
    return CliRunner().invoke(build_app(), ["synth", "-w", str(ws), *map(str, args)])


def parts(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*.parquet"))}


def test_answers_make_an_sft_dataset_with_its_provenance_and_a_rerun_does_nothing(ws):
    r = synth(ws, "--from", "tiny", "--kind", "answers", "--in", "prompts", "--set", "n=2", *FAST)
    assert r.exit_code == 0, r.output
    out = ws / "synth_answers"
    rows = read_table(out).to_pylist()
    assert sorted(r["id"] for r in rows) == sorted(f"p{i}-{s}" for i in range(7) for s in (0, 1))
    assert all(conversation(r)[-1]["role"] == "assistant" for r in rows)  # what sft reads
    assert rows[0]["answer"] == "0" and rows[0]["source"] == "synth:tiny"
    stats = json.loads((out / "manifest.json").read_text())["stats"]
    assert stats["rows_in"] == 14 == stats["rows_out"] + stats["rows_removed"]
    prov = stats["synth"]
    assert prov["model"].endswith("tiny/step-00000001") and prov["seed"] == 0 and prov["writes"] == "sft"
    assert prov["sampling"] == {"temperature": 0.7, "top_p": 1.0, "top_k": None, "max_new_tokens": 6, "n": 2}
    assert "<|assistant|>" in prov["template"] or "assistant" in prov["template"]
    again = synth(ws, "--from", "tiny", "--kind", "answers", "--in", "prompts", "--set", "n=2", *FAST)
    assert again.exit_code == 0 and "up to date" in again.output


def test_a_sigkill_mid_run_and_a_rerun_give_the_bytes_of_an_uninterrupted_run(ws, tmp_path):
    args = ["--from", "tiny", "--kind", "answers", "--in", "prompts", *FAST]
    assert synth(ws, *args, "--out", "straight").exit_code == 0
    env = {**os.environ, "LLMKIT_KILL_AT": "task:built@2", "OMP_NUM_THREADS": "1"}
    killed = subprocess.run([sys.executable, "-m", "llmkit", "synth", "-w", str(ws), *args, "--out", "killed"],
                            env=env, cwd=REPO, capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    assert not (ws / "killed" / "manifest.json").exists()
    r = synth(ws, *args, "--out", "killed")
    assert r.exit_code == 0 and "tasks already done (resumed)" in r.output, r.output
    assert parts(ws / "killed") == parts(ws / "straight") and parts(ws / "straight")


def test_magpie_instructions_count_every_sample_kept_or_removed_by_reason(ws):
    r = synth(ws, "--from", "tiny", "--kind", "instructions", "--set", "rows=5", "--set", "temperature=1.0",
              "--set", "max_new_tokens=4", "--set", "rows_per_task=2", "--allow-empty")
    assert r.exit_code == 0, r.output
    stats = json.loads((ws / "synth_instructions" / "manifest.json").read_text())["stats"]
    assert stats["rows_in"] == 5 == stats["rows_out"] + stats["rows_removed"]
    assert set(stats["removed_by_reason"]) <= {"no_end_of_turn", "more_than_one_turn", "empty_instruction"}
    assert stats["synth"]["template"] == "<|user|>"  # the user-turn prefix the model wrote after


@pytest.mark.parametrize("args, phrase", [
    (["--from", "tiny"], "synth needs --kind"),
    (["--from", "tiny", "--kind", "essay"], "kind must be one of"),
    (["--from", "tiny", "--kind", "answers"], "give --in"),
    (["--from", "tiny", "--kind", "instructions", "--in", "prompts"], "reads no dataset"),
    (["--kind", "answers", "--in", "prompts"], "synth needs --from MODEL"),
    (["--from", "tiny", "--kind", "answers", "--in", "docs"], "none of messages, prompt"),
    (["--from", "nothing", "--kind", "answers", "--in", "prompts"], "nothing"),
    (["--from", "tiny", "--kind", "pairs", "--in", "prompts", "--set", "temperature=0"], "temperature > 0"),
    (["--from", "tiny", "--kind", "answers", "--in", "prompts", "--set", "styles=poem"], "styles"),
    (["--from", "tiny", "--kind", "answers", "--in", "prompts", "--set", "decode.weights=q4"],
     "decode.weights must be one of fp32, bf16, f16, int8"),
])
def test_a_mistake_in_the_command_exits_2_naming_it(ws, args, phrase):
    r = synth(ws, *args)
    assert r.exit_code == 2 and phrase in r.output and "Traceback" not in r.output, r.output


def test_the_local_judges_read_probabilities_from_the_model(tok):
    import math

    from llmkit.synth.engine import LocalGenerator

    gen = LocalGenerator(tiny_model(tok.vocab_size, seed=3), tok, batch_size=2)
    chats = [[{"role": "user", "content": f"What is {i}+{i}?"}] for i in range(3)]
    p = gen.yes_probability(chats)
    assert len(p) == 3 and all(0 < x < 1 for x in p)
    lp = gen.answer_logprobs(chats, ["2", "4", ""])
    assert len(lp) == 3 and all(math.isfinite(x) and x < 0 for x in lp)
    assert gen.user_turn_prefix().ids == (tok.bos_id, tok.role_ids["user"])


def test_pairs_judged_by_the_model_judge_make_a_preference_dataset(ws):
    r = synth(ws, "--from", "tiny", "--kind", "pairs", "--in", "prompts", "--set", "judge_combine=mean",
              "--set", "temperature=1.0", *FAST, "--allow-empty")
    assert r.exit_code == 0, r.output
    stats = json.loads((ws / "synth_pairs" / "manifest.json").read_text())["stats"]
    assert stats["rows_in"] == 7 == stats["rows_out"] + stats["rows_removed"]
    rows = read_table(ws / "synth_pairs").to_pylist()
    assert all(r["chosen"] != r["rejected"] and r["margin"] > 0 for r in rows)


def test_decode_weights_reach_the_local_generator_and_its_model_judge(ws, monkeypatch):
    import llmkit.model.packed_linear as packed
    import llmkit.synth.judges as judges
    from llmkit.model import cpu_kernels
    from llmkit.model.decode_weights import CONVERTED
    from llmkit.synth.engine import _OPEN

    if not cpu_kernels.low_precision_available("int8"):
        pytest.skip("needs the int8 kernels")
    monkeypatch.setattr(packed, "MIN_ELEMENTS", 1)  # the tiny model's matrices are below the real bar
    judged = []

    def judge_pairs(*args, **options):
        judged.append(options["decode"].weights)
        return real_judge_pairs(*args, **options)

    real_judge_pairs = judges.judge_pairs
    monkeypatch.setattr(judges, "judge_pairs", judge_pairs)
    r = synth(ws, "--from", "tiny", "--kind", "pairs", "--in", "prompts", "--set", "decode.weights=int8",
              "--set", "temperature=1.0", *FAST, "--allow-empty", "--out", "pairs_int8")
    assert r.exit_code == 0, r.output
    gen = next(g for (path, _), g in _OPEN.items() if path.endswith("tiny/step-00000001"))
    assert gen.weights == "int8" and judged and set(judged) == {"int8"}
    assert vars(gen.model.lm_head)[CONVERTED][0][0] == "int8"  # its products went through the int8 copy
