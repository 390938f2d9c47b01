"""The judging server: the standard library's http.server, one page and two API routes.

Routes: `/`, `/app.js`, `/app.css` (the page, no data in it), `GET /api/next?rater=NAME` (the
rater's next item and progress) and `POST /api/judge` (a judgement with its optional scores,
answered only once it is fsynced to the journal). Nothing else is served: no file paths, no
directory listings.

Safety: loopback only unless a token is given (`check_bind`); with a token every API request
must carry it (`X-Llmkit-Token` header); on loopback the Host header must name loopback, so a
web page elsewhere cannot reach the API through DNS rebinding; a POST must be JSON (a plain
form from another site cannot send that) and at most 1 MB, a larger one is answered 413 before
its body is read. The page sets every text with textContent, under a Content-Security-Policy
that runs no inline script.

Robustness: a bad request (a Content-Length that is not an ASCII number, a body that is not
JSON or nested too deep to parse) is answered 400 with a JSON error, never a traceback; every
connection has a socket timeout (`SOCKET_TIMEOUT_S`), so a request sent halfway cannot hold its
thread for ever; at most `MAX_CONNECTIONS` are served at once, a further one is answered 503.
One server per session: the journal's lock (`llmkit.judge.journal`) refuses a second one.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import socket
import sys
import threading
import time
from contextlib import suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from llmkit.errors import UserError
from llmkit.judge.journal import CHOICES, JOURNAL_FILE, Journal
from llmkit.judge.page import APP_CSS, APP_JS, PAGE_HTML
from llmkit.judge.ratings import clean_scores
from llmkit.judge.session import prepare_session, read_items

MAX_BODY = 1 << 20  # bytes of a POST body; a judgement is well under 1 KB
MAX_RATER = 64  # characters of a rater's name
DRAIN_BYTES, DRAIN_SECONDS = 64 << 20, 2.0  # read (and drop) of a refused body, see `refuse_body`
SOCKET_TIMEOUT_S = 20.0  # a connection silent this long is closed (a request sent halfway)
MAX_CONNECTIONS = 32  # served at once, a thread each; a few raters' browsers need a dozen
TOKEN_HEADER = "X-Llmkit-Token"
STATIC = {"/": (PAGE_HTML, "text/html"), "/app.js": (APP_JS, "text/javascript"),
          "/app.css": (APP_CSS, "text/css")}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # the page's URL may hold the token
    "Cache-Control": "no-store",
}


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def check_bind(host: str, port: int, token: str | None) -> None:
    """Refuse a port that is none, and to listen beyond this machine without a token."""
    if not 0 <= port <= 65535:
        raise UserError(f"--port {port} is no TCP port: give one from 1 to 65535 (0: any free one)")
    if not is_loopback(host) and not token:
        raise UserError(f"--host {host} lets other machines reach the judging page: give --token SECRET "
                        "(or LLMKIT_JUDGE_TOKEN) that raters must present, or listen on 127.0.0.1")
    if token is not None and len(token) < 8:
        raise UserError("--token must be at least 8 characters")


class Session:
    """What requests read and write: the items in their order, the journal, the access rules."""

    def __init__(self, directory: Path, token: str | None):
        self.items = read_items(directory)
        self.by_id = {item["id"]: item for item in self.items}
        self.journal = Journal(Path(directory) / JOURNAL_FILE)
        self.token = token
        self.hosts: set[str] | None = None  # Host headers accepted; None: any (a token guards)

    def progress(self, rater: str) -> dict:
        return {"done": len(self.journal.judged_by(rater) & self.by_id.keys()), "total": len(self.items)}

    def next_item(self, rater: str) -> dict:
        judged = self.journal.judged_by(rater)
        item = next((i for i in self.items if i["id"] not in judged), None)
        shown = None if item is None else {k: item[k] for k in ("id", "prompt", "left", "right")}
        return {"item": shown, **self.progress(rater)}

    def judge(self, body: dict) -> dict:
        rater, item, choice = body.get("rater"), body.get("item"), body.get("choice")
        problem = rater_problem(rater) or self.item_problem(item) or (
            None if choice in CHOICES else f"choice must be one of {', '.join(CHOICES)}")
        if problem:
            raise ValueError(problem)
        scores = clean_scores(body.get("scores"))
        known = self.by_id[item]
        record, duplicate = self.journal.append({
            "rater": rater, "item": item, "choice": choice,
            "left_model": known["left_model"], "right_model": known["right_model"],
            **({"scores": scores} if scores else {})})
        return {"saved": True, "id": record["id"], "choice": record["choice"], "duplicate": duplicate,
                **self.progress(rater)}

    def item_problem(self, item) -> str | None:
        return None if isinstance(item, str) and item in self.by_id else f"no item {str(item)[:40]!r} here"


def rater_problem(rater) -> str | None:
    if not isinstance(rater, str) or not rater.strip() or len(rater) > MAX_RATER or \
            any(ord(c) < 32 for c in rater):
        return f"rater must be a name of 1 to {MAX_RATER} printable characters"
    return None


class Handler(BaseHTTPRequestHandler):
    server_version = "llmkit-judge"
    session: Session  # set on the subclass `serve` makes

    def do_GET(self):
        url = urlsplit(self.path)
        if not self.host_allowed():
            return
        if url.path in STATIC:
            body, kind = STATIC[url.path]
            return self.send(200, body.encode("utf-8"), f"{kind}; charset=utf-8")
        if url.path != "/api/next":
            return self.send_json(404, {"error": "not found"})
        if self.authorized():
            rater = parse_qs(url.query).get("rater", [""])[0]
            problem = rater_problem(rater)
            if problem:
                return self.send_json(400, {"error": problem})
            self.send_json(200, self.session.next_item(rater))

    def do_POST(self):
        if not self.host_allowed() or not self.authorized():
            return self.refuse_body()
        if urlsplit(self.path).path != "/api/judge":
            return self.refuse_body(404, "not found")
        length = self.headers.get("Content-Length")
        if length is None:
            return self.refuse_body(411, "a POST needs a Content-Length")
        length = length.strip()
        if not (length.isascii() and length.isdigit()):  # "²" is a digit to str.isdigit
            return self.refuse_body(400, "Content-Length must be a number of bytes (ASCII digits)")
        if len(length) > 9 or int(length) > MAX_BODY:
            return self.refuse_body(413, f"the body is over {MAX_BODY} bytes")
        if self.headers.get_content_type() != "application/json":
            return self.refuse_body(415, "send the judgement as application/json")
        try:
            data = self.rfile.read(int(length))
        except TimeoutError:
            return self.refuse_body(408, f"the body did not arrive within {self.timeout:g} s")
        if len(data) < int(length):
            self.close_connection = True
            return  # the client went away mid-body: nobody to answer
        try:
            body = json.loads(data)
            answer = self.session.judge(body if isinstance(body, dict) else {})
        except RecursionError:
            return self.send_json(400, {"error": "the body is JSON nested too deep; send a judgement"})
        except ValueError as e:  # bad JSON or a bad field (UnicodeDecodeError is one too)
            return self.send_json(400, {"error": str(e)})
        self.send_json(200, answer)

    def host_allowed(self) -> bool:
        hosts = self.session.hosts
        if hosts is None or self.headers.get("Host", "") in hosts:
            return True
        self.send_json(403, {"error": "this server answers requests to its loopback address only"})
        return False

    def authorized(self) -> bool:
        token = self.session.token
        if token is None or hmac.compare_digest(self.headers.get(TOKEN_HEADER, "").encode(), token.encode()):
            return True
        self.send_json(403, {"error": "a valid token is required (open the page with ?token=…)"})
        return False

    def refuse_body(self, status: int | None = None, error: str = "") -> None:
        """Answer without reading the body, then drop what the client still sends (for a short
        while): closing a socket with unread data resets it, and the client would lose the answer."""
        if status is not None:
            self.send_json(status, {"error": error})
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(0.2)
            deadline, dropped = time.monotonic() + DRAIN_SECONDS, 0
            while dropped < DRAIN_BYTES and time.monotonic() < deadline:
                chunk = self.rfile.read1(1 << 16)
                if not chunk:
                    break
                dropped += len(chunk)
        except OSError:
            pass

    def send_json(self, status: int, payload: dict) -> None:
        self.send(status, json.dumps(payload, ensure_ascii=False).encode("utf-8"), "application/json; charset=utf-8")

    def send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in SECURITY_HEADERS.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def version_string(self) -> str:
        return self.server_version  # not Python's version: nothing a client needs

    def log_message(self, format, *args):  # noqa: A002 - http.server's signature
        pass  # one line per request drowns the startup message; the journal is the record


BUSY_BODY = b'{"error": "too many connections at once; retry in a few seconds"}'
BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
        b"Retry-After: 5\r\nContent-Length: %d\r\n\r\n%s" % (len(BUSY_BODY), BUSY_BODY))


class JudgeServer(ThreadingHTTPServer):
    """A thread per connection, at most `MAX_CONNECTIONS` at once: one more is answered 503
    from the accepting thread, which never waits on it."""

    daemon_threads = True

    def __init__(self, *args, **kwargs):
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address) -> None:
        if not self.slots.acquire(blocking=False):
            request.setblocking(False)  # the accepting thread waits on nobody
            with suppress(OSError):
                request.recv(1 << 16)  # what came already: closing on unread data resets the answer
            with suppress(OSError):
                request.send(BUSY)
            return self.shutdown_request(request)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):  # a client gone or
            super().handle_error(request, client_address)  # silent is no error of ours; a full disk is


def make_server(session_dir: Path, host: str, port: int, token: str | None) -> ThreadingHTTPServer:
    """A bound server (port 0: any free one), not yet serving; refused while another serves
    the session."""
    check_bind(host, port, token)
    session = Session(session_dir, token)
    handler = type("SessionHandler", (Handler,), {"session": session, "timeout": SOCKET_TIMEOUT_S})
    server_class = type("Server", (JudgeServer,), {
        "address_family": socket.AF_INET6 if ":" in host else socket.AF_INET})
    try:
        server = server_class((host.strip("[]"), port), handler)
    except OSError as e:
        session.journal.close()
        raise UserError(f"cannot listen on {host}:{port} ({e.strerror}); pick another --port") from None
    bound = server.server_address[1]
    if token is None:
        session.hosts = {f"{name}:{bound}" for name in ("127.0.0.1", "localhost", "[::1]", host)}
    where = f"[{host.strip('[]')}]" if ":" in host else host
    session.journal.note_holder(url=f"http://{where}:{bound}/")
    return server


def serve(session_dir: Path, host: str, port: int, token: str | None) -> None:
    """Serve until interrupted (Ctrl-C); every judgement is on disk when its page says saved."""
    server = make_server(session_dir, host, port, token)
    bound = server.server_address[1]
    where = f"[{host}]" if ":" in host else host
    session = server.RequestHandlerClass.session
    print(f"judge: {len(session.items)} items, {len(session.journal.records)} judgements so far; "
          f"judging page at http://{where}:{bound}/" + (" (raters add ?token=YOUR_TOKEN)" if token else ""),
          file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        session.journal.close()


def run_serve(ctx, cfg, models: str | None, prompts: str | None, host: str, port: int,
              token: str | None) -> None:
    """`llmkit judge`: the session --from × --prompts (prepared into --out when not up to
    date), or without them the existing session --in (default `judge`), served until Ctrl-C."""
    check_bind(host, port, token)  # before minutes of generation, not after
    session = prepare_session(ctx, cfg, models, prompts) if models or prompts else ctx.input(default="judge")
    serve(session.path, host, port, token)
