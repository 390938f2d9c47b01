"""PII redaction: planted e-mail addresses, IPs, phone numbers, resident ID numbers and bank
cards in Chinese and English prose are all replaced by their placeholders and counted in the
clean manifest; digit strings that fail the checksums are left alone."""

import json
import random

import pytest

from llmkit.data.clean import CleanConfig
from llmkit.data.clean_stage import run_clean
from llmkit.data.ingest import IngestConfig, run_ingest
from llmkit.data.io import read_table
from llmkit.data.pii import PII_TYPES, PLACEHOLDER, cn_id_valid, luhn_valid, redact
from llmkit.data.rules import RULE_NAMES
from llmkit.errors import ConfigError
from tests.conftest import write_jsonl


def luhn_complete(rng: random.Random, length: int, prefix: str = "") -> str:
    body = prefix + "".join(rng.choice("0123456789") for _ in range(length - 1 - len(prefix)))
    return next(body + d for d in "0123456789" if luhn_valid(body + d))


def cn_id(rng: random.Random) -> str:
    body = (f"{rng.randint(110000, 659000)}{rng.randint(1950, 2005)}{rng.randint(1, 12):02d}"
            f"{rng.randint(1, 28):02d}{rng.randint(0, 999):03d}")
    return next(body + c for c in "0123456789X" if cn_id_valid(body + c))


def planted(rng: random.Random) -> dict[str, list[str]]:
    """One value of each shape a type takes."""
    card = luhn_complete(rng, 16, "62")
    return {
        "email": [f"user{rng.randint(1, 999)}@example.com", "zhang.san+news@mail.example.cn"],
        "ip": [f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}",
               "2001:db8::8a2e:370:7334", "fe80::1"],
        "cn_id": [cn_id(rng)],
        "bank_card": [card, " ".join(card[i:i + 4] for i in range(0, 16, 4)),
                      luhn_complete(rng, 19, "6")],
        "phone": [f"13{rng.randint(100000000, 999999999)}", f"+86 139 {rng.randint(1000, 9999)} 5678",
                  "010-62751234", "(0755)88889999", "+44 20 7946 0958", "+1 (415) 555-2671"],
    }


ZH = "请联系我们：{}。如有疑问，请于工作日致电。"
EN = "For questions write to {} on any working day, and we will answer."


def test_every_planted_value_in_chinese_and_english_prose_is_replaced_by_its_placeholder():
    rng = random.Random(0)
    for _ in range(20):
        for kind, values in planted(rng).items():
            for value in values:
                for prose in (ZH, EN):
                    text, found = redact(prose.format(value), PII_TYPES)
                    assert text == prose.format(PLACEHOLDER[kind]), (kind, value, text)
                    assert found == {kind: 1}


def failing_digit_strings(rng: random.Random, n: int) -> list[str]:
    """Digit strings of card and ID lengths (13-19) that fail Luhn and the ID check."""
    out = []
    while len(out) < n:
        s = "".join(rng.choice("0123456789") for _ in range(rng.randint(13, 19)))
        if not luhn_valid(s) and not (len(s) == 18 and cn_id_valid(s)):
            out.append(s)
    return out


def test_a_thousand_digit_strings_that_fail_the_checksums_are_left_alone():
    strings = failing_digit_strings(random.Random(1), 1500)
    for s in strings:
        for prose in (ZH, EN):
            assert redact(prose.format(s), PII_TYPES) == (prose.format(s), {}), s


def test_look_alikes_stay_and_a_type_switched_off_is_not_touched():
    keep = ("version 1.2.3 at 12:30:45, std::vector<int> and a::b, order 20240305 "
            "and 1.2.3.4.5, ISBN 978-7-111-12345-6")
    assert redact(keep, PII_TYPES) == (keep, {})
    text = "mail a@b.org from 192.168.0.1"
    assert redact(text, ["ip"]) == ("mail a@b.org from [IP]", {"ip": 1})


def test_clean_counts_in_its_manifest_exactly_the_values_planted(make_ctx, tmp_path):
    rng = random.Random(2)
    rows, want = [], {k: 0 for k in PII_TYPES}
    for i in range(60):
        values = planted(rng)
        kinds = rng.sample(PII_TYPES, 3)
        parts = [(k, rng.choice(values[k])) for k in kinds]
        for k, _ in parts:
            want[k] += 1
        prose = ZH if i % 2 else EN
        rows.append({"id": f"d{i}", "text": " ".join(prose.format(v) for _, v in parts)})
    rows.append({"id": "clean", "text": EN.format("the office") + " 4111111111111112"})
    run_ingest(make_ctx(), [str(write_jsonl(tmp_path / "pii.jsonl", rows))], IngestConfig())
    cfg = CleanConfig(pii=list(PII_TYPES), disabled_rules=list(RULE_NAMES))
    b = run_clean(make_ctx(), cfg)
    stats = json.loads((b.final / "manifest.json").read_text())["stats"]
    assert stats["pii_redacted"] == want
    texts = dict(zip(*read_table(b.final).select(["id", "text"]).to_pydict().values()))
    assert texts["clean"].endswith("4111111111111112")  # fails Luhn: not a card
    assert sum(t.count("[") for t in texts.values()) == sum(want.values())


def test_an_unknown_pii_type_is_refused_naming_the_closest():
    with pytest.raises(ConfigError, match=r"clean.pii: unknown 'emails'; did you mean 'email'"):
        CleanConfig(pii=["emails"])
