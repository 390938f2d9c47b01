"""A web page's main text, extracted where `extract_timeout_s` can stop it: in a child process.

resiliparse parses and extracts in single C calls that no signal interrupts, and a few KB of
gzip make pages that keep them busy for minutes: elements nested thousands deep (the
extractor's time grows with the depth cubed), runs of misnested formatting tags (the parser's
grows with their count squared). So each reading thread keeps a child process that parses and
extracts page after page, started on its first page (~0.1 s); a page that overruns is answered
by killing the child, and the next page starts another (datatrove's extractors do the same, for
the same reason). A page whose elements nest deeper than `max_depth` is refused before
extraction, in the time its parse takes, instead of waiting for the timeout.

It imports nothing from llmkit: the child runs this file as a script.
"""

from __future__ import annotations

import atexit
import importlib
import os
import pickle
import select
import signal
import subprocess
import sys
import threading

_local = threading.local()  # this thread's child
_children: list[_Child] = []  # every live one, ended at exit
_lock = threading.Lock()
READY = b"ready"  # what the child says once it can take pages


def main_text(html: str, max_depth: int) -> dict:
    """{"text", "title"} of the page `html`, or {"reason", "detail"}: why it has none."""
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    tree = HTMLTree.parse(html)
    if _nests_deeper(tree, max_depth):
        return {"reason": "nesting_too_deep",
                "detail": f"elements nest deeper than max_nesting_depth={max_depth}"}
    text = extract_plain_text(tree, main_content=True, list_bullets=False, alt_texts=False)
    return {"text": text, "title": tree.title or None}


def _nests_deeper(tree, depth: int) -> bool:
    """Whether an element lies deeper than `depth` (<html> at 1), asked of the tree in C: a
    chain of depth + 1 elements, each the child of the one before (~6% of the extraction's
    time on Debian's HTML documentation)."""
    return tree.document.query_selector(" > ".join(["*"] * (depth + 1))) is not None


def extract(html: str, max_depth: int, timeout_s: float) -> dict | None:
    """`main_text(html, max_depth)` computed in this thread's child, or None when it takes
    over `timeout_s` (0: no limit, computed here)."""
    if not timeout_s:
        return main_text(html, max_depth)
    child = getattr(_local, "child", None)
    if child is not None and child.owner == os.getpid() and child.proc.poll() is not None:
        child.end()  # it died idle (killed by someone): replaced
        child = None
    if child is None or child.owner != os.getpid():  # a forked copy of a reader makes its own
        child = _local.child = _Child()
    answer = child.ask(pickle.dumps((html, max_depth)), timeout_s)
    if answer is None or not child.alive:
        child.end()
        _local.child = None
    return answer


class _Child:
    def __init__(self):
        self.owner, self.alive = os.getpid(), True
        # run as a file, not as llmkit.data.html_extract: the child needs no llmkit on its path
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import runpy, sys; del sys.path[0]; "
             "runpy.run_path(sys.argv[1], run_name='__main__')", __file__],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        with _lock:
            _children.append(self)
        # its start and imports must not count against the first page's time
        if _read_frame(self.proc.stdout) != READY:
            self.end()
            raise RuntimeError("the page-extracting process did not start (its error is above)")

    def ask(self, request: bytes, timeout_s: float) -> dict | None:
        """The child's answer, or None past `timeout_s`; if the child died, why (`alive` False)."""
        try:
            _write_frame(self.proc.stdin, request)
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
            answer = _read_frame(self.proc.stdout) if ready else None
        except OSError:  # the pipe broke: the child is gone
            ready, answer = True, None
        if ready and answer is None:
            self.alive = False
            return {"reason": "extraction_failed",
                    "detail": f"the extracting process died (exit code {self.proc.wait()})"}
        return None if answer is None else pickle.loads(answer)

    def end(self):
        with _lock:
            if self in _children:
                _children.remove(self)
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:  # its buffer held a request the dead child never read
                pass


@atexit.register
def _end_children():
    for child in list(_children):
        if child.owner == os.getpid():
            child.end()


def _write_frame(f, payload: bytes):
    f.write(len(payload).to_bytes(8, "little") + payload)
    f.flush()


def _read_frame(f) -> bytes | None:
    """One length-prefixed payload, or None at the end of the stream."""
    header = f.read(8)
    if len(header) < 8:
        return None
    size = int.from_bytes(header, "little")
    payload = f.read(size)
    return payload if len(payload) == size else None


def _serve():
    """The child: answer each request on stdin with its main_text on stdout, until stdin ends."""
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must not corrupt the answers
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    for module in ("resiliparse.parse.html", "resiliparse.extract.html2text"):
        importlib.import_module(module)  # loaded before the first page's clock starts
    _write_frame(answers, READY)
    while (request := _read_frame(requests)) is not None:
        html, max_depth = pickle.loads(request)
        try:
            answer = main_text(html, max_depth)
        except Exception as e:  # noqa: BLE001 — the parent quarantines the page with it
            answer = {"reason": "extraction_failed", "detail": f"{type(e).__name__}: {e}"[:500]}
        _write_frame(answers, pickle.dumps(answer))


if __name__ == "__main__":
    _serve()
