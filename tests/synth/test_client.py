"""`llmkit synth --set server.url=…` against a tiny OpenAI-compatible stub started here on
loopback (it answers deterministically: the client is under test, not a model): failed and slow
requests are retried, the rows come back in the prompts' order, and a run that stops on a server
that keeps failing resumes with no row lost and none twice."""

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.data.io import read_table
from llmkit.errors import UserError
from llmkit.synth.client import ServerGenerator, ServerUnavailable
from llmkit.synth.requests import Raw, Sampling
from tests.train.posttrain_fixtures import write_dataset


class Stub(BaseHTTPRequestHandler):
    """Replies `echo <prompt> #<seed>`. Faults by the request's seed: `fail` seeds get a 503 on
    their first try, `slow` ones sleep past the client's timeout on their first try, `broken`
    ones get a 503 every time while `server.broken` is set, `refused` ones a 400."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server, seed = self.server, body["seed"]
        with server.lock:
            server.tries[seed] += 1
            first = server.tries[seed] == 1
        if seed in server.refused:
            return self._send(400, {"error": "bad request"})
        if (seed in server.fail and first) or (server.broken and seed in server.broken):
            return self._send(503, {"error": "busy"})
        if seed in server.slow and first:
            time.sleep(0.6)
        prompt = body["prompt"] if "prompt" in body else body["messages"][-1]["content"]
        text = f"echo {prompt} #{seed}"
        choice = {"text": text} if "prompt" in body else {"message": {"role": "assistant", "content": text}}
        self._send(200, {"choices": [{**choice, "finish_reason": "stop"}],
                         "usage": {"completion_tokens": len(text.split())}})

    def _send(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except OSError:  # the client gave up on a slow reply
            pass

    def log_message(self, *args):
        pass


@pytest.fixture
def stub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    server.lock, server.tries = threading.Lock(), Counter()
    server.fail, server.slow, server.broken, server.refused = set(), set(), set(), set()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def url(server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def client(server, **kw):
    options = dict(timeout=0.3, retries=3, backoff=0.0, concurrency=4)
    return ServerGenerator(url(server), "stub", **{**options, **kw})


def test_retries_timeouts_and_order(stub):
    stub.fail, stub.slow = {100, 103, 107}, {101, 105}
    prompts = [[{"role": "user", "content": f"q{i}"}] for i in range(10)]
    out = client(stub).complete(prompts, Sampling(0.7, 1.0, None, 8), seed=100)
    assert [c.text for c in out] == [f"echo q{i} #{100 + i}" for i in range(10)]
    assert all(c.stopped for c in out)
    raw = client(stub).complete([Raw((1,), "<|im_start|>user\n")], Sampling(1.0, 1.0, None, 8), seed=7)
    assert raw[0].text == "echo <|im_start|>user\n #7"  # a raw prefix goes to /v1/completions


def test_a_request_that_keeps_failing_names_the_server_and_a_refusal_is_not_retried(stub):
    stub.broken = {5}
    with pytest.raises(ServerUnavailable, match="4 tries failed"):
        client(stub).complete([[{"role": "user", "content": "x"}]], Sampling(0.7, 1.0, None, 8), seed=5)
    stub.refused = {6}
    with pytest.raises(UserError, match=r"refused a request \(400"):
        client(stub).complete([[{"role": "user", "content": "x"}]], Sampling(0.7, 1.0, None, 8), seed=6)
    assert stub.tries[6] == 1


def synth(ws, *args):
    return CliRunner().invoke(build_app(), ["synth", "-w", str(ws), *map(str, args)])


def test_a_run_stopped_by_a_failing_server_resumes_with_every_row_once(stub, tmp_path):
    ws = tmp_path / "ws"
    write_dataset(ws, "prompts", [{"id": f"p{i}", "prompt": f"q{i}"} for i in range(9)])
    args = ["--kind", "answers", "--in", "prompts", "--set", f"server.url={url(stub)}",
            "--set", "server.model=stub", "--set", "server.backoff=0", "--set", "server.timeout=0.3",
            "--set", "server.retries=2", "--set", "rows_per_task=3"]
    clean = synth(ws, *args, "--out", "clean")
    assert clean.exit_code == 0, clean.output
    stub.tries.clear()
    seeds = {r["response"].rsplit("#", 1)[1] for r in read_table(ws / "clean").to_pylist()}
    stub.fail = {int(s) for s in list(seeds)[::2]}  # every other request fails once
    stub.broken = {int(read_table(ws / "clean").to_pylist()[4]["response"].rsplit("#", 1)[1])}  # task 1's
    stopped = synth(ws, *args, "--out", "flaky")
    assert stopped.exit_code == 130 and "3 tries failed" in stopped.output and "rerun" in stopped.output
    stub.broken = set()
    resumed = synth(ws, *args, "--out", "flaky")
    assert resumed.exit_code == 0 and "already done (resumed)" in resumed.output, resumed.output
    rows, expected = read_table(ws / "flaky").to_pylist(), read_table(ws / "clean").to_pylist()
    assert [r["id"] for r in rows] == [f"p{i}" for i in range(9)]  # none lost, none twice, in order
    assert rows == expected
