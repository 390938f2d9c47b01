"""The server's rules without a browser: sizes, tokens, hosts and routes; judgements idempotent;
a rater who always picks the left reply moves no model (sides are random per item)."""

from __future__ import annotations

import http.client
import json

from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.judge.journal import JOURNAL_FILE, read_journal
from llmkit.judge.ranking import summarize
from llmkit.judge.server import MAX_BODY
from tests.judge.conftest import MODELS, Server, arithmetic_prompts, call, known_replies, write_session


def session_of(tmp_path, n: int = 4, models=MODELS):
    return write_session(tmp_path / "ws", "judged", arithmetic_prompts(n), known_replies(n, models))


def raw_post(url: str, body: bytes, content_type: str = "application/json") -> tuple[int, str]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("POST", "/api/judge", body=body, headers={"Content-Type": content_type})
    response = conn.getresponse()
    return response.status, response.read().decode()


def test_a_10_mb_post_is_refused_with_413_and_nothing_is_written(tmp_path):
    session = session_of(tmp_path)
    with Server(session) as server:
        item = server.session.items[0]["id"]
        judgement = json.dumps({"rater": "x" * 10, "item": item, "choice": "left", "pad": ""})
        padded = judgement.replace('"pad": ""', '"pad": "' + "a" * (10 << 20) + '"')
        assert raw_post(server.url, padded.encode())[0] == 413
        just_over = judgement.replace('"pad": ""', '"pad": "' + "a" * MAX_BODY + '"')
        assert raw_post(server.url, just_over.encode())[0] == 413
        assert raw_post(server.url, judgement.encode(), "text/plain")[0] == 415  # a plain form post
        assert not read_journal(session / JOURNAL_FILE)
        assert raw_post(server.url, judgement.encode())[0] == 200  # the same judgement, small enough
        assert len(read_journal(session / JOURNAL_FILE)) == 1


def test_a_non_loopback_bind_without_a_token_is_refused(tmp_path, monkeypatch):
    import llmkit.judge.server

    def served(*args):
        raise AssertionError(f"served on {args[1]} without a token")

    monkeypatch.setattr(llmkit.judge.server, "serve", served)
    session_of(tmp_path)
    for host in ("0.0.0.0", "192.0.2.7", "::"):
        result = CliRunner().invoke(build_app(), ["judge", "-w", tmp_path / "ws", "--in", "judged",
                                                  "--host", host, "--port", "0"])
        assert result.exit_code == 2 and "--token" in result.output and "Traceback" not in result.output


def test_with_a_token_the_api_answers_only_requests_that_carry_it(tmp_path):
    with Server(session_of(tmp_path), token="s3cret-token") as server:
        assert call(f"{server.url}/api/next?rater=a")[0] == 403
        assert call(f"{server.url}/api/next?rater=a", headers={"X-Llmkit-Token": "wrong-token"})[0] == 403
        status, answer = call(f"{server.url}/api/next?rater=a", headers={"X-Llmkit-Token": "s3cret-token"})
        assert status == 200 and answer["total"] == 12
        item = answer["item"]["id"]
        assert call(f"{server.url}/api/judge", {"rater": "a", "item": item, "choice": "left"})[0] == 403


def test_only_its_own_routes_and_loopback_hosts_are_served(tmp_path):
    session = session_of(tmp_path)
    with Server(session) as server:
        for path in ("/items.jsonl", "/journal.jsonl", "/../manifest.json", "/api/next/../../items.jsonl",
                     "/%2e%2e/manifest.json"):
            assert call(server.url + path)[0] == 404, path
        assert call(f"{server.url}/api/next?rater=a", headers={"Host": "evil.example:80"})[0] == 403
        assert call(f"{server.url}/api/next?rater=" + "n" * 65)[0] == 400


def test_a_repeated_judgement_is_answered_with_the_first_and_stored_once(tmp_path):
    session = session_of(tmp_path)
    with Server(session) as server:
        item = call(f"{server.url}/api/next?rater=ann")[1]["item"]["id"]
        first = call(f"{server.url}/api/judge", {"rater": "ann", "item": item, "choice": "left"})[1]
        again = call(f"{server.url}/api/judge", {"rater": "ann", "item": item, "choice": "right"})[1]
        other = call(f"{server.url}/api/judge", {"rater": "bob", "item": item, "choice": "right"})[1]
        assert (first["duplicate"], again["duplicate"], other["duplicate"]) == (False, True, False)
        assert again["id"] == first["id"] != other["id"] and again["choice"] == "left"
        assert call(f"{server.url}/api/judge", {"rater": "ann", "item": "nope", "choice": "left"})[0] == 400
        assert call(f"{server.url}/api/judge", {"rater": "ann", "item": item, "choice": "both"})[0] == 400
    assert [(j["rater"], j["choice"]) for j in read_journal(session / JOURNAL_FILE)] == [("ann", "left"),
                                                                                         ("bob", "right")]


def test_an_always_left_rater_gives_a_win_rate_whose_interval_holds_one_half(tmp_path):
    session = session_of(tmp_path, n=60, models=MODELS[:2])
    with Server(session) as server:
        while (item := call(f"{server.url}/api/next?rater=lefty")[1]["item"]) is not None:
            call(f"{server.url}/api/judge", {"rater": "lefty", "item": item["id"], "choice": "left"})
    judgements = read_journal(session / JOURNAL_FILE)
    assert len(judgements) == 60
    sides = [j["left_model"] for j in judgements]
    assert 0 < sides.count(MODELS[0]) < 60  # sides were drawn, not fixed
    summary = summarize(judgements, list(MODELS[:2]), resamples=500)
    rate = summary["win_rates"][0]
    assert rate["ci_low"] <= 0.5 <= rate["ci_high"]
    assert rate["win_rate"] == sides.count(MODELS[0]) / 60
    assert summary["left_share"] == {"lefty": 1.0} and summary["left_advantage"]["value"] > 2
    for row in summary["ranking"]:  # h takes the side's pull; the models stay level
        assert row["ci_low"] <= 0 <= row["ci_high"] and abs(row["score"]) < 0.2
