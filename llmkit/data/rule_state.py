"""The rules' per-process holder: what `llmkit clean` builds from its config rather than reads
in it — the rules switched on, the stop words' hashes, the boilerplate phrases by anchor word,
the URL block list, the compiled pass's parameters — and the models a rule consults (the
language identifier), built once per process and never kept on the config.

A `CleanConfig` stays plain data, so what travels to a worker process or a Ray task is its
fields and nothing compiled; `rule_state(cfg)` gives the process's holder for a config,
building it the first time it meets that content (the config's fingerprint fields, and the
block list file's size and time) and handing the same holder back for an equal config
unpickled in every batch. A rule reads it as `doc.state` (or `row.state`); a model goes on it
as a property loaded on first use, so a process whose documents never ask never loads it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np

from llmkit.core.config import config_to_dict
from llmkit.data import langid
from llmkit.data.document import measure_params, word_hash
from llmkit.data.rules import RULES
from llmkit.errors import ConfigError

_HOST = re.compile(r"(?:\*\.)?[a-z0-9-]+(?:\.[a-z0-9-]+)+\.?")


class RuleState:
    """What the rules read that is built from `cfg` (a CleanConfig)."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.rules = tuple(r for r in RULES if r.__name__ not in cfg.disabled_rules)
        anchors = phrases_by_anchor(cfg.boilerplate_phrases)
        self.ascii_anchors = [(a, ps) for a, ps in anchors if a.isascii()]
        self.other_anchors = [(a, ps) for a, ps in anchors if not a.isascii()]
        self.stop_words = frozenset(cfg.stop_words)
        self.stop_hashes = np.array(sorted({word_hash(w) for w in cfg.stop_words}), np.uint64)
        self.url_blocklist = read_url_blocklist(cfg.url_blocklist)
        self.measure_params = measure_params(cfg)

    @property
    def languages(self) -> langid.LanguageIdentifier:
        """The language identifier, loaded on first use (shared with ingest's in the process)."""
        return langid.identifier()


_BY_CONTENT: dict[str, RuleState] = {}
# the config asked last and its holder: asked again (per document in `drop_boilerplate_lines`),
# it is answered without hashing its fields again; held, so its id is never another's
_LAST: list = [None, None]
builds = 0  # holders this process has built (a test counts them)


def rule_state(cfg) -> RuleState:
    """This process's holder for `cfg`'s content, built on first use."""
    global builds
    if _LAST[0] is cfg:
        return _LAST[1]
    key = content_key(cfg)
    state = _BY_CONTENT.get(key)
    if state is None:
        state = _BY_CONTENT[key] = RuleState(cfg)
        builds += 1
    _LAST[:] = cfg, state
    return state


def content_key(cfg) -> str:
    """What the holder is built from: the fields a fingerprint hashes (not where the stage
    runs), and the block list file as it is now (a list edited in place is read again)."""
    fields = config_to_dict(cfg, fingerprint=True)
    if cfg.url_blocklist:
        try:
            st = os.stat(cfg.url_blocklist)
            fields["url_blocklist_file"] = [st.st_size, st.st_mtime_ns]
        except OSError:
            pass  # read_url_blocklist says what is wrong
    blob = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def read_url_blocklist(path: str | None) -> tuple[frozenset, tuple]:
    """(domains, URL substrings) of a block list file: one entry a line, `#` comments. An
    entry that is a bare host name (`ads.example.com`, `*.example.com`) blocks that domain and
    its subdomains; any other (`example.org/tracking`, `utm_source=`) blocks URLs holding it."""
    if path is None:
        return frozenset(), ()
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"clean.url_blocklist: cannot read {path} ({e}); give a UTF-8 text "
                          "file with a domain or URL substring per line") from None
    entries = [line.split("#", 1)[0].strip().lower() for line in lines]
    domains = {e.removeprefix("*.").strip(".") for e in entries if _HOST.fullmatch(e)}
    pieces = tuple(e for e in entries if e and not _HOST.fullmatch(e))
    return frozenset(domains), pieces


def phrases_by_anchor(phrases: list[str]) -> list[tuple[str, list[str]]]:
    """Lower-cased phrases grouped under their longest word, so that one search for "cookie"
    stands in for "use cookies", "uses cookies" and "cookie policy" in the common case of a
    document that has none of them."""
    groups: dict[str, list[str]] = {}
    for phrase in (p.lower() for p in phrases):
        anchor = max(phrase.split(), key=len)
        groups.setdefault(anchor, []).append(phrase)
    for anchor in sorted(groups, key=len):  # "cookie" also covers the phrases of "cookies"
        if anchor not in groups:
            continue
        for longer in [a for a in groups if a != anchor and anchor in a]:
            groups[anchor] += groups.pop(longer)
    return [(a, ps) for a, ps in groups.items()]
