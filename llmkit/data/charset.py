"""Which encoding a text file (txt / jsonl / json / csv) is read in: `encoding=auto` (the
default) detects it per file; any other value is the codec every file is read in.

A file whose first MB is UTF-8 is UTF-8 (a stray bad line in it is quarantined as
`invalid_utf8`, not a reason to doubt the rest). Otherwise resiliparse's detector (uchardet)
names the charset from that sample, and it is used only when it is an East Asian multi-byte
one — GB18030/GBK/GB2312, Big5, Shift-JIS, EUC-JP, EUC-KR — whose byte structure makes the
guess reliable; on a sample too short for it, GB18030 or Big5 is taken when it decodes the
bytes into common Chinese characters; a label is read as browsers read it (GBK as GB18030, Big5 as Big5-HKSCS,
Shift-JIS as cp932, EUC-KR as cp949), the superset real files are written in. A single-byte
guess (cp1252, koi8-r) would decode anything, turning a few bad bytes into a wrong text, so
such files stay UTF-8 and their bad records are quarantined: name their codec with
`--set encoding=…`.

A web page's charset is declared (HTTP header, `<meta charset>`), and `contradicted` says when
its bytes rule the declaration out (llmkit.data.readers.html then tries the next candidate).
"""

from __future__ import annotations

import codecs
import functools
import importlib.util
from pathlib import Path

from llmkit.tokenizers.cjk import COMMON_HAN
from llmkit.data.io import open_binary

SAMPLE_BYTES = 1 << 20
MIN_HAN, MIN_COMMON_SHARE = 4, 0.3
# a detected label -> the codec that reads what files so labelled really hold
EAST_ASIAN = {"gb18030": "gb18030", "gbk": "gb18030", "gb2312": "gb18030", "big5": "big5hkscs",
              "big5hkscs": "big5hkscs", "shift_jis": "cp932", "cp932": "cp932",
              "euc_jp": "euc_jp", "euc_kr": "cp949", "cp949": "cp949"}


def file_encoding(path: Path, encoding: str) -> str:
    """The codec to read `path` in: `encoding` itself unless it is `auto`."""
    if encoding != "auto":
        return encoding
    sample = _sample(path)
    if _is_utf8(sample):
        return "utf-8"
    return _detected(sample) or _chinese_by_common_characters(sample) or "utf-8"


def _sample(path: Path) -> bytes:
    """The file's first SAMPLE_BYTES, or what a truncated .gz/.zst holds of them."""
    chunks, size = [], 0
    with open_binary(path) as f:
        while size < SAMPLE_BYTES:
            try:
                chunk = f.read(1 << 16)
            except (EOFError, OSError):
                break
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    return b"".join(chunks)


def _detected(sample: bytes) -> str | None:
    """The detector's charset, if an East Asian one."""
    if not importlib.util.find_spec("resiliparse"):
        return None
    from resiliparse.parse.encoding import detect_encoding

    label = detect_encoding(sample, html5_compatible=False, from_html_meta=False)
    try:
        return EAST_ASIAN.get(codecs.lookup(label).name) if label else None
    except LookupError:
        return None


def _chinese_by_common_characters(sample: bytes) -> str | None:
    """GB18030 or Big5, whichever decodes the sample into the more common Han characters, if
    enough of them are (≥ MIN_COMMON_SHARE of at least MIN_HAN): detectors guess wrong on a
    few dozen bytes (a short poem in GBK comes out cp1256), and the other decoding of the
    same bytes is rare characters (5-10% common against 45-80%)."""
    best, best_share = None, MIN_COMMON_SHARE
    for codec in ("gb18030", "big5hkscs"):
        try:
            text = codecs.getincrementaldecoder(codec)().decode(sample, final=False)
        except UnicodeDecodeError:
            continue
        han = [c for c in text if "\u4e00" <= c <= "\u9fff"]
        share = sum(c in COMMON_HAN for c in han) / len(han) if len(han) >= MIN_HAN else 0.0
        if share >= best_share:
            best, best_share = codec, share
    return best


def _is_utf8(sample: bytes) -> bool:
    """UTF-8 but for a character the sample's end may cut in two."""
    try:
        codecs.getincrementaldecoder("utf-8")().decode(sample, final=False)
    except UnicodeDecodeError:
        return False
    return True


def contradicted(codec: str, body: bytes) -> bool:
    """Whether `body` cannot be in `codec` (a codecs name), as charset detectors decide it:
    - UTF-16/32 markup holds NULs (every ASCII character is a byte and a NUL): bytes with no
      NUL and no byte-order mark are not UTF-16, and decoded as such their ASCII pairs turn
      into CJK characters;
    - bytes that are valid UTF-8 holding multi-byte sequences are UTF-8, not a one-byte
      charset (latin-1 would read "Café" as "CafÃ©"): a latin-1 text is almost never valid
      UTF-8, as each accented letter would have to be followed by just the right symbol."""
    if codec.startswith(("utf-16", "utf-32")):
        return b"\x00" not in body and not body.startswith((codecs.BOM_UTF16_LE,
                                                             codecs.BOM_UTF16_BE))
    return _one_byte_per_character(codec) and _holds_multibyte_utf8(body)


@functools.lru_cache(maxsize=None)
def _one_byte_per_character(codec: str) -> bool:
    """latin-1, cp1252, koi8-r… (a 7-bit one too: bytes over 0x7f are not in it at all), but
    not GBK, Big5, Shift-JIS, which read some bytes in pairs."""
    high = bytes(range(0x80, 0x100))
    return not codec.startswith("utf") and len(high.decode(codec, errors="replace")) == len(high)


def _holds_multibyte_utf8(body: bytes) -> bool:
    """Valid UTF-8 (but for a character its end may cut in two) holding a non-ASCII one."""
    try:
        return not codecs.getincrementaldecoder("utf-8")().decode(body, final=False).isascii()
    except UnicodeDecodeError:
        return False


def check_encoding(encoding: str) -> str | None:
    """Why `encoding` is not a valid setting, or None."""
    if encoding == "auto":
        return None
    try:
        codecs.lookup(encoding)
    except LookupError:
        return f"encoding: unknown codec {encoding!r}; use auto, utf-8, gb18030, big5, …"
    return None


def with_charset(rec, encoding: str):
    """A record read from a file that is not UTF-8 says which charset it was (`charset`)."""
    if encoding != "utf-8" and isinstance(rec, dict) and "charset" not in rec:
        rec["charset"] = codecs.lookup(encoding).name
    return rec


def invalid_text(encoding: str) -> str:
    """The reason of a record that is not text in `encoding`: invalid_utf8, invalid_gb18030…"""
    return "invalid_utf8" if encoding == "utf-8" else f"invalid_{codecs.lookup(encoding).name}"
