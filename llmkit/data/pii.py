"""PII redaction for `llmkit clean` (`pii: [email, ip, cn_id, bank_card, phone]`), Chinese and
English text alike: each value found is replaced by its type's placeholder and counted.

- email: local@domain.tld (ASCII; the text around it may be CJK: "请发邮件至a@b.cn获取");
- ip: IPv4 dotted quads (each part 0-255) and IPv6 addresses (`ipaddress` decides);
- cn_id: mainland resident ID numbers, 18 characters, a plausible birth date and the ISO 7064
  MOD 11-2 check character (GB 11643);
- bank_card: 13-19 digits, written solid or in groups of four, that pass the Luhn check;
- phone: mainland mobiles (1[3-9]x xxxx xxxx, with or without +86 / 0086), mainland landlines
  written with their area code (010-12345678, (0755)1234567), international numbers written
  with "+" and a country code (+44 20 7946 0958), 8-15 digits.
A digit string that fails its checksum or has no phone shape is left alone: order numbers,
timestamps and ISBNs are not personal. Types are looked for in the order above, so that the
digits of a card or an ID number are not taken for a phone number.
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter

PII_TYPES = ("email", "ip", "cn_id", "bank_card", "phone")
PLACEHOLDER = {"email": "[EMAIL]", "ip": "[IP]", "cn_id": "[CN_ID]", "bank_card": "[BANK_CARD]",
               "phone": "[PHONE]"}

_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,24}")
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = re.compile(rf"(?<![\d.]){_OCTET}(?:\.{_OCTET}){{3}}(?!\d|\.\d)")
_IPV6 = re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:])")
_CN_ID = re.compile(r"(?<![\dA-Za-z])[1-9]\d{5}(?:18|19|20)\d{2}(?:0[1-9]|1[0-2])"
                    r"(?:0[1-9]|[12]\d|3[01])\d{3}[\dXx](?![\dA-Za-z])")
_CARD = re.compile(r"(?<![\d-])(?:\d{13,19}|\d{4}([ -])\d{4}\1\d{4}\1\d{1,7}|"
                   r"\d{4}([ -])\d{6}\2\d{5})(?![\d-])")
_PHONE = re.compile(
    r"(?<![\d+])(?:(?:\+|00)86[ -]?)?1[3-9]\d(?:[ -]?\d{4}){2}(?!\d)"  # mainland mobile
    r"|(?<!\d)(?:\(0\d{2,3}\)[ ]?|0\d{2,3}-)\d{7,8}(?!\d)"  # landline with its area code
    r"|(?<![\w+])\+[1-9]\d{0,2}(?:[ .-]?(?:\(\d{1,4}\)|\d{1,4})){2,6}(?!\d)")  # +CC …
_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_HAS_DIGIT = re.compile(r"\d")


def cn_id_valid(value: str) -> bool:
    """The 18th character is the ISO 7064 MOD 11-2 check of the first 17 (GB 11643)."""
    total = sum(int(d) * w for d, w in zip(value[:17], _ID_WEIGHTS))
    return "10X98765432"[total % 11] == value[17].upper()


def luhn_valid(digits: str) -> bool:
    total = 0
    for i, d in enumerate(reversed(digits)):
        n = int(d) * (2 if i % 2 else 1)
        total += n - 9 if n > 9 else n
    return total % 10 == 0


def _ipv6_valid(value: str) -> bool:
    if value.count(":") < 2 or not _HAS_DIGIT.search(value):  # "std::map" has no digit
        return False
    try:
        ipaddress.IPv6Address(value)
    except ValueError:
        return False
    return True


def _international_phone(value: str) -> bool:
    return 8 <= sum(c.isdigit() for c in value) <= 15


def _card(value: str) -> bool:
    digits = value.replace(" ", "").replace("-", "")
    return 13 <= len(digits) <= 19 and luhn_valid(digits)


def _phone(value: str) -> bool:
    return not value.startswith("+") or value.startswith("+86") or _international_phone(value)


# type -> its patterns, each with the check a match must pass (None: none)
_FINDERS = {
    "email": ((_EMAIL, None),),
    "ip": ((_IPV4, None), (_IPV6, _ipv6_valid)),
    "cn_id": ((_CN_ID, cn_id_valid),),
    "bank_card": ((_CARD, _card),),
    "phone": ((_PHONE, _phone),),
}


def redact(text: str, types) -> tuple[str, Counter]:
    """(text with each PII value of `types` replaced by its placeholder, count per type)."""
    found: Counter = Counter()
    if not _HAS_DIGIT.search(text) and "@" not in text:
        return text, found  # every type holds a digit, but an e-mail address
    for kind in PII_TYPES:
        if kind not in types:
            continue
        for pattern, valid in _FINDERS[kind]:
            text = pattern.sub(_replacer(kind, valid, found), text)
    return text, found


def _replacer(kind: str, valid, found: Counter):
    placeholder = PLACEHOLDER[kind]

    def replace(m: re.Match) -> str:
        if valid is not None and not valid(m.group()):
            return m.group()
        found[kind] += 1
        return placeholder
    return replace
