"""Optional 1–5 scores ride with a judgement: checked by the server, stored once, exported per
reply and summarised per model and criterion; ranked lists where a rater ordered every model."""

from __future__ import annotations

import json

import numpy as np

from llmkit.data.io import read_table
from llmkit.judge.journal import JOURNAL_FILE, Journal, read_journal
from llmkit.judge.ratings import criteria_markdown, criterion_means
from llmkit.judge.session import read_items
from tests.judge.conftest import MODELS, Server, arithmetic_prompts, call, known_replies, write_session
from tests.judge.test_export import llmkit


def test_scores_are_checked_and_the_first_ones_stored_with_the_judgement(tmp_path):
    session = write_session(tmp_path / "ws", "judged", arithmetic_prompts(2), known_replies(2, MODELS[:2]))
    with Server(session) as server:
        item = call(f"{server.url}/api/next?rater=ann")[1]["item"]["id"]
        judge = {"rater": "ann", "item": item, "choice": "left"}
        for bad in ({"left": {"fluency": 6}}, {"left": {"fluency": 0}}, {"middle": {"fluency": 3}},
                    {"left": {"humour": 3}}, {"left": {"safety": True}}, {"left": {"safety": 2.5}}, [4, 5]):
            status, answer = call(f"{server.url}/api/judge", {**judge, "scores": bad})
            assert status == 400 and "fluency, relevance, safety" in answer["error"], bad
        assert not read_journal(session / JOURNAL_FILE)
        scores = {"left": {"fluency": 5, "safety": 1}, "right": {}}
        assert call(f"{server.url}/api/judge", {**judge, "scores": scores})[0] == 200
        again = call(f"{server.url}/api/judge", {**judge, "scores": {"left": {"fluency": 1}}})[1]
        assert again["duplicate"]
        other = call(f"{server.url}/api/judge", {**judge, "rater": "bob", "choice": "tie"})[1]
        assert not other["duplicate"]
    stored = read_journal(session / JOURNAL_FILE)
    assert stored[0]["scores"] == {"left": {"fluency": 5, "safety": 1}}  # the empty side left out
    assert "scores" not in stored[1] and len(stored) == 2


def test_criterion_means_per_model_with_intervals_and_their_table():
    judgements = [{"left_model": "a", "right_model": "b", "scores": {"left": {"fluency": 4}, "right": {"fluency": 2}}},
                  {"left_model": "b", "right_model": "a", "scores": {"right": {"fluency": 5, "safety": 3}}},
                  {"left_model": "a", "right_model": "b"}]
    means = criterion_means(judgements, ["a", "b"], 200, np.random.default_rng(0))
    found = {(m["model"], m["criterion"]): m for m in means}
    assert set(found) == {("a", "fluency"), ("a", "safety"), ("b", "fluency")}
    assert (found["a", "fluency"]["n"], found["a", "fluency"]["mean"]) == (2, 4.5)
    assert found["a", "fluency"]["ci_low"] == 4.0 and found["a", "fluency"]["ci_high"] == 5.0
    assert found["b", "fluency"] == {"model": "b", "criterion": "fluency", "n": 1, "mean": 2.0,
                                     "ci_low": 2.0, "ci_high": 2.0}
    table = criteria_markdown(means, ["a", "b"])
    assert "| a | 4.50 [4.00, 5.00] (2) | – | 3.00 [3.00, 3.00] (1) |" in table
    assert "| b | 2.00 [2.00, 2.00] (1) | – | – |" in table
    assert criteria_markdown([], ["a"]) == []


def closest(item) -> str:
    """The side nearer the sum: MODELS[k] is off by 10·k, so every prompt orders all models."""
    total = sum(map(int, item["prompt"].removeprefix("What is ").rstrip("?").split("+")))
    return "left" if abs(int(item["left"]) - total) < abs(int(item["right"]) - total) else "right"


def test_export_writes_ratings_score_means_and_ranked_lists_that_ingest_reads(tmp_path):
    ws = tmp_path / "ws"
    session = write_session(ws, "judged", arithmetic_prompts(5), known_replies(5))
    items = read_items(session)
    journal = Journal(session / JOURNAL_FILE)
    for item in items:  # ann orders every prompt's three models; bob ties and scores relevance
        journal.append({"rater": "ann", "item": item["id"], "choice": closest(item),
                        "left_model": item["left_model"], "right_model": item["right_model"]})
        right = {side: {"relevance": 5 if item[f"{side}_model"] == MODELS[0] else 2} for side in ("left", "right")}
        journal.append({"rater": "bob", "item": item["id"], "choice": "tie", "scores": right,
                        "left_model": item["left_model"], "right_model": item["right_model"]})
    journal.close()
    llmkit("judge", "--export", "-w", ws, "--in", "judged", "--out", "prefs", "--set", "resamples=50")

    ranked = [json.loads(line) for line in (ws / "prefs" / "ranked.jsonl").open()]
    assert len(ranked) == 5 and {r["rater"] for r in ranked} == {"ann"}  # bob's ties order nothing
    replies = known_replies(5)
    for lst in ranked:
        n = int(lst["prompt_id"][1:])
        assert lst["models"] == list(MODELS) and lst["responses"] == [replies[m][n] for m in MODELS]
    ratings = [json.loads(line) for line in (ws / "prefs" / "ratings.jsonl").open()]
    assert len(ratings) == 2 * len(items) and {r["rater"] for r in ratings} == {"bob"}
    assert all(r["relevance"] == (5 if r["model"] == MODELS[0] else 2) and r["fluency"] is None for r in ratings)
    summary = json.loads((ws / "prefs" / "ranking.json").read_text())
    means = {m["model"]: (m["criterion"], m["n"], m["mean"]) for m in summary["criteria"]}
    assert means == {MODELS[0]: ("relevance", 10, 5.0), MODELS[1]: ("relevance", 10, 2.0),
                     MODELS[2]: ("relevance", 10, 2.0)}
    stats = json.loads((ws / "prefs" / "manifest.json").read_text())["stats"]
    assert (stats["rated_replies"], stats["ranked_lists"]) == (30, 5)
    assert f"| {MODELS[0]} | – | 5.00 [5.00, 5.00] (10) | – |" in (ws / "prefs" / "summary.md").read_text()

    llmkit("ingest", "-w", ws, "--kind", "preference", ws / "prefs" / "ranked.jsonl", "--out", "from_ranked")
    pairs = {(r["prompt"], r["chosen"], r["rejected"]) for r in read_table(ws / "from_ranked").to_pylist()}
    assert pairs == {(r["prompt"], r["chosen"], r["rejected"]) for r in read_table(ws / "prefs").to_pylist()}
    llmkit("report", "-w", ws, "prefs")
    assert f"| {MODELS[0]} | – | 5.00 [5.00, 5.00] (10) | – |" in (ws / "report" / "prefs" / "summary.md").read_text()
