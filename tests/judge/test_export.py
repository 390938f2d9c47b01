"""`llmkit judge --export`: the journal as preference pairs and a ranking, rebuilt when the journal
grows; `llmkit report` plots the ranking."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.data.io import read_table
from llmkit.judge.journal import JOURNAL_FILE, Journal
from llmkit.judge.session import read_items
from tests.judge.conftest import MODELS, arithmetic_prompts, known_replies, write_session


def llmkit(*args) -> str:
    result = CliRunner().invoke(build_app(), [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


def judge_all(session, rater: str, prefer) -> None:
    """A scripted rater: `prefer(item)` is the side it picks."""
    journal = Journal(session / JOURNAL_FILE)
    for item in read_items(session):
        journal.append({"rater": rater, "item": item["id"], "choice": prefer(item),
                        "left_model": item["left_model"], "right_model": item["right_model"]})
    journal.close()


def right_answer(item) -> str:
    """The side whose reply is the sum (MODELS[0] answers right, the others are off by 10·k)."""
    total = sum(map(int, item["prompt"].removeprefix("What is ").rstrip("?").split("+")))
    left, right = item["left"] == str(total), item["right"] == str(total)
    return "tie" if left == right else "left" if left else "right"


def test_export_ranks_the_right_model_first_rebuilds_as_the_journal_grows_and_report_plots_it(tmp_path):
    ws = tmp_path / "ws"
    session = write_session(ws, "judged", arithmetic_prompts(10), known_replies(10))
    judge_all(session, "ann", right_answer)
    args = ["judge", "--export", "-w", ws, "--in", "judged", "--out", "prefs", "--set", "resamples=100"]
    llmkit(*args)
    ranking = json.loads((ws / "prefs" / "ranking.json").read_text())
    assert ranking["ranking"][0]["model"] == MODELS[0]
    assert ranking["ranking"][0]["ci_low"] > max(r["ci_high"] for r in ranking["ranking"][1:])
    rows = read_table(ws / "prefs").to_pylist()
    assert len(rows) == 20 and {r["chosen_model"] for r in rows} == {MODELS[0]}  # 10 ties left out
    stats = json.loads((ws / "prefs" / "manifest.json").read_text())["stats"]
    assert (stats["judgements"], stats["pairs"], stats["ties"]) == (30, 20, 10)
    assert "up to date" in llmkit(*args)

    judge_all(session, "bob", lambda item: "skip")
    assert "up to date" not in llmkit(*args)
    assert json.loads((ws / "prefs" / "manifest.json").read_text())["stats"]["skips"] == 30

    llmkit("report", "-w", ws, "prefs")
    llmkit("report", "-w", ws, "prefs")  # written anew, not appended to
    report = ws / "report" / "report"
    assert (report / "ranking-prefs.png").stat().st_size > 1000
    summary = (report / "summary.md").read_text()
    assert summary.count("Human judgements: prefs") == 1 and f"| 1 | {MODELS[0]} |" in summary
    assert "Training report" not in summary  # no empty table of training runs
