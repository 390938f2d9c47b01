"""Math answer equivalence: a reward of 1 when a completion states the row's answer, in any form.

`answers_equal(gold, predicted)` is math-verify's judgement (Hugging Face's `math-verify` 0.9,
the parser TRL's `accuracy_reward` uses: LaTeX, `\\boxed{}`, fractions, decimals against
fractions, percentages, units, thousands separators, sets, intervals, tuples, equations)
on the two texts after these steps of its own:

- Chinese answers read as English ones: full-width digits, letters and punctuation become ASCII
  (`１２／５` -> `12/5`, `。` -> `.`), answer phrases become math-verify's anchor (`答案是`,
  `答案为`, `最终答案：`, `结果是` -> `final answer is`), `百分之25` -> `25%`, and a space
  separates Han characters from the maths beside them (`答案为12个` -> `... 12 个`), which
  math-verify's word boundaries need. Chinese numerals (`二分之一`) are not read.
- A bare answer (no `$`, `\\(`, `\\[` or `\\boxed`: what an `answer` column holds) is read both
  as plain text and as LaTeX between `$…$`; which is tried first depends on whether it looks
  like LaTeX (a backslash, a brace, a caret, a bracketed list), the other when the first finds
  nothing. math-verify alone reads `\\{1,2\\}` or `\\sqrt{2}/2` outside `$…$` as nothing and
  `(1, 2)` as `2`.
- A text without an anchor (`\\boxed`, "answer") states its answer last: its last sentence
  or line is read first, the whole text when that holds nothing. math-verify alone prefers any
  LaTeX in the working (`First, $2+3=5$. 7/9` reads as 5).
- A full stop after a number ends the sentence, not the number: math-verify reads `is 17/3.`
  as 17/3.0, a float that then misses 17/3 at its 6-digit rounding.
- Pathological input is bounded: only the last `MAX_CHARS` characters of a text are read, and
  every parse and comparison runs under math-verify's timeout (`TIMEOUT_S`) — a signal alarm,
  which only the main thread can set. Called from another thread there is no alarm, so a text
  holding a huge power or factorial (`2^{10^{10}}`, `(10^{10})!`, `x^{100000}`) is refused
  before sympy sees it (`looks_pathological`): the answer scores 0, or None for a gold answer.

`math_reward` is a reward function with TRL's signature: the reference answer comes from the
row's `answer` column, else its `solution` column (TRL's name); a completion is a string or a
conversation (a list of `{role, content}` messages, of which the last is read). A row whose
gold answer math-verify cannot read scores None (skipped), as TRL's `accuracy_reward` does.

math-verify (and sympy, latex2sympy2_extended) load on first use: `pip install
'llmkit[rl]'` or `pip install math-verify`.
"""

from __future__ import annotations

import logging
import re
import threading
from functools import lru_cache
from typing import Any, Sequence

from llmkit.errors import ConfigError

ANSWER_COLUMNS = ("answer", "solution")  # the first a row has is its reference answer
MAX_CHARS = 4000  # the tail of a completion that is read: answers come last
TIMEOUT_S = 5  # math-verify's own default, per parse and per comparison (main thread only)

# full-width forms U+FF01..U+FF5E are ASCII shifted by 0xFEE0; the rest are common CJK marks
_TO_ASCII = {c: c - 0xFEE0 for c in range(0xFF01, 0xFF5F)}
_TO_ASCII.update({0x3000: " ", 0x3002: ". ", 0x3001: ", ", 0x2212: "-", 0x00D7: r" \times ",
                  0x00F7: r" \div ", 0x300C: '"', 0x300D: '"'})
_HAN = "\u3400-\u4dbf\u4e00-\u9fff"
_ZH_ANSWER = re.compile(r"(?:所以|因此|故)?[,，\s]*(?:最终|最后)?的?(?:答案|结果|答)\s*(?:应该|应)?"
                        r"\s*(?:是|为|:|=)\s*")
_ZH_PERCENT = re.compile(r"百分之\s*(\d+(?:\.\d+)?)")
_HAN_THEN_MATH = re.compile(rf"([{_HAN}])(?=[0-9A-Za-z\\$(\[{{+\-.])")
_MATH_THEN_HAN = re.compile(rf"([0-9A-Za-z$)\]}}.%])(?=[{_HAN}])")
_DELIMITED = re.compile(r"(?<!\\)\$|\\\(|\\\[|\\boxed|\\fbox")
_FULL_STOP = re.compile(r"(\d)\.(?=\s|$)")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_ANCHORED = re.compile(r"\\boxed|\\fbox|answer", re.I)
_LOOKS_LATEX = re.compile(r"[\\{}^_]|^\s*[(\[].*,.*[)\]]\s*$")
# a power whose exponent holds another power or 5+ digits, a factorial of 4+ digits or of a
# group: what sympy may spend minutes or gigabytes on
_HUGE = re.compile(r"(\^|\*\*)\s*(\{[^}]*(\^|\*\*|\d{5})|\(?[^{(]?\d{5})|\d{4,}\s*!|[)}]\s*!")


def to_english(text: str) -> str:
    """`text` with its Chinese answer phrasing and full-width characters as math-verify reads
    them (see the module docstring); English text comes back unchanged but for ×, ÷ and the
    minus sign −, which become LaTeX's and ASCII's."""
    text = text.translate(_TO_ASCII)
    if not re.search(f"[{_HAN}]", text):
        return text
    text = _ZH_PERCENT.sub(r"\1%", text)
    text = _ZH_ANSWER.sub(" The final answer is ", text)
    text = _HAN_THEN_MATH.sub(r"\1 ", text)
    return _MATH_THEN_HAN.sub(r"\1 ", text)


def looks_pathological(text: str) -> bool:
    """True when `text` writes a number too large to evaluate (a power tower, a power or
    factorial of a large number): refused where no timeout can stop sympy."""
    return bool(_HUGE.search(text))


def answers_equal(gold: str, predicted: str) -> bool:
    """True when `predicted` (an answer or a whole completion, English or Chinese) states the
    same mathematical answer as `gold` (an answer, LaTeX or plain); False when it does not or
    either side cannot be read."""
    return bool(_judge(gold, predicted))


def math_reward(prompts: Sequence[Any], completions: Sequence[Any], **columns: Sequence[Any]
                ) -> list[float | None]:
    """1.0 for each completion whose answer equals its row's (`answers_equal`), else 0.0;
    None where the row has no gold answer or math-verify cannot read it."""
    name = next((c for c in ANSWER_COLUMNS if c in columns), None)
    if name is None:
        raise ConfigError(f"the math reward needs the reference answer in a column "
                          f"{' or '.join(map(repr, ANSWER_COLUMNS))}; the rows have "
                          f"{sorted(columns) or 'no other columns'}")
    golds = columns[name]
    if len(golds) != len(completions):
        raise ValueError(f"{len(completions)} completions but {len(golds)} {name}s")
    rewards: list[float | None] = []
    for gold, completion in zip(golds, completions):
        verdict = None if gold is None else _judge(str(gold), completion_text(completion))
        rewards.append(None if verdict is None else float(verdict))
    return rewards


def completion_text(completion: Any) -> str:
    """A completion's text: the string itself, or the content of a conversation's last message."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content") or "")
    return str(completion)


def _judge(gold: str, predicted: str) -> bool | None:
    """answers_equal, or None when the gold answer cannot be read."""
    mv = _math_verify()
    timeout = _timeout()
    gold_parsed = _parse(gold, timeout)
    if not gold_parsed:
        return None
    predicted_parsed = _parse(predicted, timeout)
    if not predicted_parsed:
        return False
    return bool(mv.verify(gold_parsed, predicted_parsed, timeout_seconds=timeout))


def _parse(text: str, timeout: int | None) -> list:
    """math-verify's reading of `text` (see the module docstring), [] for nothing."""
    text = to_english(text[-MAX_CHARS:]).strip()
    if not text or (timeout is None and looks_pathological(text)):
        return []
    last = _SENTENCE_END.split(text)[-1].strip()
    if last != text and not _ANCHORED.search(text):  # no anchor: the answer is what comes last
        parsed = _parse_statement(last, timeout)
        if parsed:
            return parsed
    return _parse_statement(text, timeout)


def _parse_statement(text: str, timeout: int | None) -> list:
    mv = _math_verify()
    text = _FULL_STOP.sub(r"\1", text).strip()
    if _DELIMITED.search(text):
        return mv.parse(text, parsing_timeout=timeout)
    as_latex = "$" + re.sub(r"(?<!\\)%", r"\\%", text.rstrip(".")) + "$"
    readings = [as_latex, text] if _LOOKS_LATEX.search(text) else [text, as_latex]
    for reading in readings:
        parsed = mv.parse(reading, parsing_timeout=timeout)
        if parsed:
            return parsed
    return []


def _timeout() -> int | None:
    """math-verify's timeout where its signal alarm works (the main thread), else None (and
    its warning that timeouts are off is silenced: looks_pathological stands in)."""
    if threading.current_thread() is threading.main_thread():
        return TIMEOUT_S
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).setLevel(logging.ERROR)
    return None


@lru_cache(maxsize=1)
def _math_verify():
    try:
        import math_verify
    except ImportError:
        raise ConfigError("the math reward needs math-verify: pip install 'llmkit[rl]' "
                          "(or pip install 'math-verify>=0.9,<0.10')") from None
    return math_verify
