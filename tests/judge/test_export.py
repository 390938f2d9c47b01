"""`llmkit judge --export`: the journal as preference pairs and a ranking, rebuilt when the journal
grows; `llmkit report` plots the ranking."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.data.io import read_table
from llmkit.errors import UserError
from llmkit.judge.export import ranked_lists
from llmkit.judge.journal import JOURNAL_FILE, Journal
from llmkit.judge.session import pair_items, read_items
from tests.judge.conftest import MODELS, Server, arithmetic_prompts, known_replies, write_session


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
    report = ws / "report" / "prefs"
    assert (report / "ranking-prefs.png").stat().st_size > 1000
    summary = (report / "summary.md").read_text()
    assert summary.count("Human judgements: prefs") == 1 and f"| 1 | {MODELS[0]} |" in summary
    assert "Training report" not in summary  # no empty table of training runs


def llmkit_refused(*args) -> str:
    result = CliRunner().invoke(build_app(), [str(a) for a in args])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    return result.output


def test_an_export_never_replaces_a_session_nor_a_session_an_export_without_force(tmp_path):
    from llmkit.core.workspace import Workspace

    ws = tmp_path / "ws"
    session = write_session(ws, "judged", arithmetic_prompts(4), known_replies(4))
    other = write_session(ws, "other", arithmetic_prompts(4), known_replies(4), seed=1)
    judge_all(session, "ann", right_answer)
    judge_all(other, "bob", right_answer)
    journal = (other / JOURNAL_FILE).read_bytes()
    output = llmkit_refused("judge", "--export", "-w", ws, "--in", "judged", "--out", "other")
    assert "other" in output and "--force" in output
    assert (other / JOURNAL_FILE).read_bytes() == journal  # bob's 12 judgements are still there

    llmkit("judge", "--export", "-w", ws, "--in", "judged", "--out", "prefs")
    assert json.loads((ws / "prefs" / "manifest.json").read_text())["kind"] == "judge-export"
    with pytest.raises(UserError, match="judge-export"):  # a session (stage judge) onto the export
        Workspace(ws).builder("prefs", stage="judge", config={"models": list(MODELS)})
    # served, a session is replaced by nothing, --force or not
    with Server(other):
        output = llmkit_refused("judge", "--export", "-w", ws, "--in", "judged", "--out", "other", "--force")
        assert "being judged now" in output
    llmkit("judge", "--export", "-w", ws, "--in", "judged", "--out", "other", "--force")


def test_an_export_made_before_kinds_were_recorded_is_rebuilt_without_force(tmp_path):
    ws = tmp_path / "ws"
    session = write_session(ws, "judged", arithmetic_prompts(4), known_replies(4))
    judge_all(session, "ann", right_answer)
    llmkit("judge", "--export", "-w", ws, "--in", "judged", "--out", "prefs")
    manifest = json.loads((ws / "prefs" / "manifest.json").read_text())
    del manifest["kind"]
    (ws / "prefs" / "manifest.json").write_text(json.dumps(manifest))
    judge_all(session, "bob", lambda item: "left")
    llmkit("judge", "--export", "-w", ws, "--in", "judged", "--out", "prefs")
    manifest = json.loads((ws / "prefs" / "manifest.json").read_text())
    assert manifest["kind"] == "judge-export" and manifest["stats"]["raters"] == 2


def test_a_side_picked_between_identical_replies_is_no_pair_and_is_counted(tmp_path):
    ws = tmp_path / "ws"
    replies = {MODELS[0]: ["30", "33", "36"], MODELS[1]: ["30", "43", "46"]}  # agree on the first
    session = write_session(ws, "judged", arithmetic_prompts(3), replies)
    judge_all(session, "ann", lambda item: "left")
    output = llmkit("judge", "--export", "-w", ws, "--in", "judged", "--out", "prefs")
    rows = read_table(ws / "prefs").to_pylist()
    assert len(rows) == 2 and all(r["chosen"] != r["rejected"] for r in rows)
    stats = json.loads((ws / "prefs" / "manifest.json").read_text())["stats"]
    assert (stats["judgements"], stats["pairs"], stats["identical_pairs"]) == (3, 2, 1)
    assert "1 sides picked between identical replies left out" in output


def test_a_ranked_list_that_holds_one_reply_twice_is_not_exported():
    replies = {MODELS[0]: ["30", "33"], MODELS[1]: ["40", "43"], MODELS[2]: ["50", "43"]}
    items = {i["id"]: i for i in pair_items(arithmetic_prompts(2), replies, seed=0)}
    rank = {m: k for k, m in enumerate(MODELS)}  # a total order: alpha > beta > gamma
    judgements = [{"rater": "ann", "item": i["id"], "choice": "left" if rank[i["left_model"]] <
                   rank[i["right_model"]] else "right"} for i in items.values()]
    lists = ranked_lists(judgements, items, list(MODELS))
    assert [(r["prompt_id"], r["responses"]) for r in lists] == [("q0", ["30", "40", "50"])]


def test_judgements_repeated_in_the_journal_are_exported_once_the_first(tmp_path):
    ws = tmp_path / "ws"
    session = write_session(ws, "judged", arithmetic_prompts(4), known_replies(4, MODELS[:2]))
    judge_all(session, "ann", lambda item: "left")
    lines = (session / JOURNAL_FILE).read_text().splitlines()
    flipped = [line.replace('"choice": "left"', '"choice": "right"') for line in lines]
    # what two servers on one session wrote before the lock: every judgement again, the other side
    (session / JOURNAL_FILE).write_text("\n".join(lines + flipped) + "\n")
    llmkit("judge", "--export", "-w", ws, "--in", "judged", "--out", "prefs")
    rows = read_table(ws / "prefs").to_pylist()
    assert len(rows) == 4 and {r["chosen"] for r in rows} == {i["left"] for i in read_items(session)}
    stats = json.loads((ws / "prefs" / "manifest.json").read_text())["stats"]
    assert (stats["judgements"], stats["pairs"], stats["repeats"]) == (4, 4, 4)
