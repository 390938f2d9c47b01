"""Generation tasks: greedy replies to prompts, scored against references with BLEU and ROUGE.

A row has a prompt (`prompt`, or `messages` up to the last assistant turn) and its reference(s):
`references` (a list), or `answer` / `reference` / the reply the row gives (`response`,
`chosen`, the last assistant message). `lang` (en / zh) picks the tokenisation; without it a
reference that is mostly Han characters is Chinese.

- BLEU is sacrebleu's corpus BLEU, with its `zh` tokenizer for Chinese (each Han character a
  token) and `13a` otherwise.
- ROUGE-1/2/L are rouge-score's F-measures (best over references, averaged, × 100). rouge-score's
  own tokenizer drops every non-ASCII character, so Chinese is split here: each Han character
  (or each jieba word, `zh_tokenizer: jieba`) is a token, as are runs of ASCII letters/digits.
- exact match: the share of replies equal to a reference up to whitespace (`llmkit.rewards.verify`).
- contains: the share of replies that hold a reference anywhere, ignoring case, as a whole word
  where it begins or ends with a letter or digit ("7" is not in "17", "Rome" not in "Romeo") —
  the lenient check for a question whose reply is a sentence ("The capital of Japan is Tokyo.").
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Literal

from llmkit.data.chat import prompt_messages
from llmkit.errors import ConfigError, UserError
from llmkit.rewards.verify import exact_match

HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


@dataclass
class GenerationConfig:
    files: list[str] = field(default_factory=list)  # prompt + reference files (jsonl/json/parquet) or datasets
    max_new_tokens: int = 64        # reply length limit
    prompt_format: Literal["auto", "chat", "plain"] = "auto"  # auto: the template where `generate` uses one
    stop_at_newline: bool = True    # plain prompts: the reply ends at its first newline
    zh_tokenizer: Literal["char", "jieba"] = "char"  # how ROUGE splits Chinese
    batch_size: int = 16            # prompts generated together
    max_examples: int | None = None  # at most this many rows per file

    def __post_init__(self):
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise ConfigError("generation.max_new_tokens and generation.batch_size must be ≥ 1")
        if self.max_examples is not None and self.max_examples < 1:
            raise ConfigError(f"generation.max_examples must be ≥ 1, got {self.max_examples}")


# -- metrics -----------------------------------------------------------------------------------

def is_chinese(text: str) -> bool:
    chars = [c for c in text if not c.isspace()]
    return bool(chars) and sum(bool(HAN.match(c)) for c in chars) / len(chars) >= 0.3


class ChineseTokenizer:
    """rouge-score tokenizer: Han characters (or jieba words) and lowercased ASCII alphanumeric runs;
    punctuation and spaces are dropped, as rouge-score's default tokenizer does for English."""

    def __init__(self, mode: str = "char"):
        if mode not in ("char", "jieba"):
            raise ConfigError(f"zh_tokenizer must be char or jieba, got {mode!r}")
        self.mode = mode

    def tokenize(self, text: str) -> list[str]:
        if self.mode == "jieba":
            import logging

            import jieba

            jieba.setLogLevel(logging.WARNING)
            words = jieba.lcut(text)
        else:
            words = re.findall(r"[A-Za-z0-9]+|\S", text)
        return [w.lower() for w in (w.strip() for w in words) if w and not _is_punctuation(w)]


def _is_punctuation(word: str) -> bool:
    return all(unicodedata.category(c)[0] in "PSZ" for c in word)


def bleu(hypotheses: list[str], references: list[list[str]], chinese: bool) -> float:
    """sacrebleu corpus BLEU; each hypothesis has one or more references."""
    import sacrebleu

    width = max(len(r) for r in references)
    # a repeated reference changes neither BLEU's clipped counts nor its closest length
    streams = [[refs[min(k, len(refs) - 1)] for refs in references] for k in range(width)]
    return sacrebleu.corpus_bleu(hypotheses, streams, tokenize="zh" if chinese else "13a").score


def rouge(hypotheses: list[str], references: list[list[str]], chinese: bool,
          zh_tokenizer: str = "char") -> dict[str, float]:
    """Mean rouge-score F-measures (× 100), each the best over the hypothesis' references."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), tokenizer=ChineseTokenizer(zh_tokenizer)
                                      if chinese else None)
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    for hyp, refs in zip(hypotheses, references):
        scores = scorer.score_multi(refs, hyp)
        for t in ROUGE_TYPES:
            totals[t] += scores[t].fmeasure
    return {t: 100 * v / max(len(hypotheses), 1) for t, v in totals.items()}


def exact_match_rate(hypotheses: list[str], references: list[list[str]]) -> float:
    """Share of hypotheses equal to one of their references, up to whitespace."""
    hits = sum(any(exact_match(h, r) for r in refs) for h, refs in zip(hypotheses, references))
    return hits / max(len(hypotheses), 1)


def contains_rate(hypotheses: list[str], references: list[list[str]]) -> float:
    """Share of hypotheses that hold one of their references (see the module's docstring)."""
    hits = sum(any(_contains(h, r) for r in refs) for h, refs in zip(hypotheses, references))
    return hits / max(len(hypotheses), 1)


def _contains(text: str, reference: str) -> bool:
    ref = " ".join(reference.split())
    if not ref:
        return False
    # only ASCII letters and digits join into words; Han characters have no word boundaries to check
    before = r"(?<![A-Za-z0-9])" if re.match(r"[A-Za-z0-9]", ref) else ""
    after = r"(?![A-Za-z0-9])" if re.search(r"[A-Za-z0-9]$", ref) else ""
    pattern = before + r"\s+".join(re.escape(w) for w in ref.split(" ")) + after
    return re.search(pattern, text, flags=re.IGNORECASE) is not None


def text_metrics(hypotheses: list[str], references: list[list[str]], chinese: bool,
                 zh_tokenizer: str = "char") -> dict:
    return {"bleu": bleu(hypotheses, references, chinese),
            **rouge(hypotheses, references, chinese, zh_tokenizer),
            "exact_match": exact_match_rate(hypotheses, references),
            "contains": contains_rate(hypotheses, references), "examples": len(hypotheses)}


# -- rows --------------------------------------------------------------------------------------

def references_of(row: dict, where: str) -> list[str]:
    refs = row.get("references")
    if isinstance(refs, list) and refs and all(isinstance(r, str) for r in refs):
        return refs
    for key in ("reference", "answer", "response", "chosen"):
        if isinstance(row.get(key), str):
            return [row[key]]
    messages = row.get("messages") or []
    replies = [m.get("content") for m in messages if m.get("role") == "assistant"]
    if replies:
        return [replies[-1]]
    raise UserError(f"{where}: no reference (`references`, `reference`, `answer`, `response`)")


def language_of(row: dict, refs: list[str]) -> str:
    lang = str(row.get("lang") or "")
    if lang in ("en", "zh"):
        return lang
    return "zh" if is_chinese(refs[0]) else "en"


def prompt_ids(tokenizer, row: dict, chat: bool, where: str) -> list[int]:
    """The tokens a reply follows: the chat template with the assistant's turn opened, or the
    plain prompt after `Tokenizer.document_start_ids()` (`</s>`, a document start)."""
    if row.get("prompt") is None and not row.get("messages"):
        raise UserError(f"{where}: no `prompt` (or `messages`) to generate from")
    messages = prompt_messages(row)
    if chat:
        return tokenizer.encode_chat(messages, add_generation_prompt=True)[0]
    text = "\n".join(m["content"] for m in messages)
    return [*tokenizer.document_start_ids(), *tokenizer.encode(text)]


# -- generation --------------------------------------------------------------------------------

def evaluate_generation(model, tokenizer, rows: list[dict], cfg: GenerationConfig, *, chat: bool,
                        device, name: str = "generation") -> tuple[dict, list[dict]]:
    """Metrics by language for one file, and the samples (prompt, references, reply, lang)."""
    from llmkit.model.decoding import generate_replies, reply_text

    refs = [references_of(r, f"{name} row {i + 1}") for i, r in enumerate(rows)]
    langs = [language_of(r, ref) for r, ref in zip(rows, refs)]
    prompts = [prompt_ids(tokenizer, r, chat, f"{name} row {i + 1}") for i, r in enumerate(rows)]
    stop_ids = [tokenizer.end_of_turn_id, tokenizer.eos_id] if chat else [tokenizer.eos_id]
    replies = generate_replies(model.to(device).eval(), prompts, stop_ids=stop_ids,
                               pad_id=tokenizer.pad_id, max_new_tokens=cfg.max_new_tokens,
                               batch_size=cfg.batch_size)
    texts = [reply_text(tokenizer, r, cut=len(r) == cfg.max_new_tokens) for r in replies]
    if not chat and cfg.stop_at_newline:
        texts = [t.strip("\n").split("\n", 1)[0] for t in texts]
    texts = [t.strip() for t in texts]
    metrics = {}
    for lang in sorted(set(langs)):
        idx = [i for i, l in enumerate(langs) if l == lang]
        metrics[lang] = text_metrics([texts[i] for i in idx], [refs[i] for i in idx],
                                     lang == "zh", cfg.zh_tokenizer)
    samples = [{"prompt": r.get("prompt") if r.get("prompt") is not None else r.get("messages"),
                "references": ref, "reply": t, "lang": l}
               for r, ref, t, l in zip(rows, refs, texts, langs)]
    return metrics, samples
