"""The server's rules without a browser: sizes, tokens, hosts and routes; judgements idempotent;
a rater who always picks the left reply moves no model (sides are random per item)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import time

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


def exchange(url: str, raw: bytes, wait: float = 5.0) -> tuple[int | None, dict]:
    """(status, JSON answer) of bytes sent as they are; (None, {}) when the server closes the
    connection without an answer. Raises TimeoutError when it neither answers nor closes."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as sock:
        sock.sendall(raw)
        answer = b""
        while chunk := sock.recv(1 << 16):
            answer += chunk
    if not answer:
        return None, {}
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def post_head(length: bytes, port: int) -> bytes:
    return (b"POST /api/judge HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
            b"Content-Length: %s\r\n\r\n" % (port, length))


def test_bad_bodies_and_content_lengths_are_answered_400_in_json_and_the_server_goes_on(tmp_path, capfd):
    session = session_of(tmp_path)
    with Server(session) as server:
        port = server.httpd.server_address[1]
        nested = b'{"rater": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        assert raw_post(server.url, nested)[0] == 400
        status, answer = exchange(server.url, post_head(b"\xb2", port) + b"{}")  # '²' passes str.isdigit
        assert status == 400 and "Content-Length" in answer["error"]
        assert exchange(server.url, post_head(b"9" * 5000, port) + b"{}")[0] == 413
        item = server.session.items[0]["id"]
        assert call(f"{server.url}/api/judge", {"rater": "ann", "item": item, "choice": "left"})[0] == 200
    assert "Traceback" not in capfd.readouterr().err


def test_a_request_sent_halfway_is_closed_after_the_socket_timeout(tmp_path, capfd, monkeypatch):
    import llmkit.judge.server

    monkeypatch.setattr(llmkit.judge.server, "SOCKET_TIMEOUT_S", 0.3)
    with Server(session_of(tmp_path)) as server:
        port = server.httpd.server_address[1]
        started = time.monotonic()
        status, answer = exchange(server.url, post_head(b"100", port) + b'{"rater": ')  # 90 bytes short
        assert status == 408 and "did not arrive" in answer["error"]
        assert exchange(server.url, b"GET /api/next?rater=a HTTP/1.1\r\nHo") == (None, {})  # head cut short
        assert time.monotonic() - started < 4
        assert call(f"{server.url}/api/next?rater=a")[0] == 200
    assert "Traceback" not in capfd.readouterr().err


def test_connections_beyond_the_cap_are_answered_503_until_one_is_freed(tmp_path, monkeypatch):
    import llmkit.judge.server

    monkeypatch.setattr(llmkit.judge.server, "MAX_CONNECTIONS", 3)
    with Server(session_of(tmp_path)) as server:
        port = server.httpd.server_address[1]
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
        request = b"GET /api/next?rater=a HTTP/1.0\r\nHost: 127.0.0.1:%d\r\n\r\n" % port
        status, answer = exchange(server.url, request)
        assert status == 503 and "too many connections" in answer["error"]
        for sock in idle:
            sock.close()
        deadline = time.monotonic() + 5
        while (status := exchange(server.url, request)[0]) == 503 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status == 200


def test_a_port_that_is_none_exits_2_naming_it(tmp_path):
    session_of(tmp_path)
    for port in ("70000", "-1"):
        result = CliRunner().invoke(build_app(), ["judge", "-w", tmp_path / "ws", "--in", "judged",
                                                  "--port", port])
        assert result.exit_code == 2 and f"--port {port}" in result.output, result.output
        assert "Traceback" not in result.output


def test_a_second_server_on_a_served_session_exits_2_naming_the_session_and_the_first(tmp_path, monkeypatch):
    import socketserver

    def served(*args, **kwargs):
        raise AssertionError("a second server served the session")

    session = session_of(tmp_path)
    with Server(session) as server:
        monkeypatch.setattr(socketserver.BaseServer, "serve_forever", served)  # the first serves already
        result = CliRunner().invoke(build_app(), ["judge", "-w", tmp_path / "ws", "--in", "judged",
                                                  "--port", "0"])
        assert result.exit_code == 2, result.output
        assert str(session) in result.output and f"{server.url}/" in result.output
        assert f"process {os.getpid()}" in result.output
        item = server.session.items[0]["id"]
        assert call(f"{server.url}/api/judge", {"rater": "ann", "item": item, "choice": "left"})[0] == 200
    assert len(read_journal(session / JOURNAL_FILE)) == 1
