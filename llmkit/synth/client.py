"""An OpenAI-compatible server (vLLM, llama.cpp's server, SGLang…) as `llmkit synth`'s generator.

Chats go to `/v1/chat/completions`, a raw prefix (Magpie) to `/v1/completions`, one request per
sample, each with its own seed (`seed + index`), `server.concurrency` at a time; replies are put
back in the prompts' order, so the rows do not depend on which request finished first. A request
that fails for a passing reason (no connection, a timeout, 408, 429, 5xx) is tried again after
`server.backoff` seconds, doubled each time, up to `server.retries` more times; one that still
fails stops the run as an interruption does (exit 130, `ServerUnavailable`), one the server
refuses (another 4xx) as a mistake in the command (exit 2), with the server's words. A task's
rows are written whole or not at all (llmkit.data.driver), so a rerun redoes only the tasks that
did not finish: no row lost, none twice.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from llmkit.errors import UserError
from llmkit.synth.prompts import yes_no
from llmkit.synth.requests import GREEDY_VERDICT, Completion, Raw, Sampling

PASSING = {408, 429, 500, 502, 503, 504}  # HTTP statuses worth another try


class ServerUnavailable(KeyboardInterrupt):
    """The server kept failing: the run stops as an interrupted one does (exit 130), keeping
    its sealed tasks for the rerun (a UserError, a refusal of the command, would clear them)."""


class ServerGenerator:
    def __init__(self, url: str, model: str, *, timeout: float, retries: int, backoff: float,
                 concurrency: int, sleep=time.sleep):
        base = url.rstrip("/")
        self.base = base if base.endswith("/v1") else base + "/v1"
        self.model, self.timeout, self.retries = model, timeout, retries
        self.backoff, self.concurrency, self.sleep = backoff, concurrency, sleep
        self.tokens = 0  # completion tokens the server reported
        self.requests = self.retried = 0

    def complete(self, prompts: list, sampling: Sampling, seed: int) -> list[Completion]:
        bodies = [self._body(p, sampling, seed + i) for i, p in enumerate(prompts)]
        with ThreadPoolExecutor(self.concurrency) as pool:
            replies = list(pool.map(self._post, bodies))  # map keeps the prompts' order
        return [self._completion(r, b) for r, b in zip(replies, bodies)]

    def yes_probability(self, prompts: list) -> list[float]:
        """1 for a reply that starts with yes, 0 for no, 0.5 for neither (greedy replies)."""
        verdicts = self.complete(prompts, GREEDY_VERDICT, 0)
        return [{True: 1.0, False: 0.0, None: 0.5}[yes_no(c.text)] for c in verdicts]

    def _body(self, prompt, sampling: Sampling, seed: int) -> tuple[str, dict]:
        body = {"model": self.model, "max_tokens": sampling.max_new_tokens,
                "temperature": sampling.temperature, "top_p": sampling.top_p, "seed": seed, "n": 1}
        if sampling.top_k is not None:
            body["top_k"] = sampling.top_k  # vLLM's and llama.cpp's extension
        if isinstance(prompt, Raw):
            return "/completions", {**body, "prompt": prompt.text}
        return "/chat/completions", {**body, "messages": prompt}

    def _completion(self, reply: dict, request: tuple[str, dict]) -> Completion:
        try:
            choice = reply["choices"][0]
            text = choice["text"] if request[0] == "/completions" else choice["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise UserError(f"{self.base}{request[0]} answered without choices[0]'s text: "
                            f"{json.dumps(reply)[:300]}") from None
        used = (reply.get("usage") or {}).get("completion_tokens") or 0
        self.tokens += used
        return Completion(text or "", used, choice.get("finish_reason") != "length")

    def _post(self, request: tuple[str, dict]) -> dict:
        path, body = request
        data = json.dumps(body).encode()
        for attempt in range(self.retries + 1):
            self.requests += 1
            try:
                req = urllib.request.Request(self.base + path, data=data, method="POST",
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=self.timeout) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as e:
                if e.code not in PASSING:
                    raise UserError(f"{self.base}{path} refused a request ({e.code} {e.reason}): "
                                    f"{e.read()[:300].decode(errors='replace')}") from None
                why = f"{e.code} {e.reason}"
            except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError,
                    json.JSONDecodeError) as e:
                why = str(getattr(e, "reason", e))
            if attempt == self.retries:
                raise ServerUnavailable(f"{self.base}{path}: {self.retries + 1} tries failed (last: "
                                        f"{why}); the tasks done so far are kept: rerun the same "
                                        "command to go on")
            self.retried += 1
            self.sleep(self.backoff * 2 ** attempt)
        raise AssertionError("unreachable")
