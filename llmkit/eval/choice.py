"""Multiple-choice accuracy on MMLU / C-Eval style files, by log-likelihood.

A question row has `question`, its choices as a `choices` list (MMLU) or as `A`, `B`, `C`, `D`
… fields (C-Eval), and `answer` as a letter or a 0-based index; `subject` is optional.

Each choice is scored by the log-likelihood the model gives it after the prompt, and the best
one is the model's answer (the lm-evaluation-harness method):
- `format: text` (cloze): the prompt is the question and the continuation is the choice's text;
  `acc` compares summed log-likelihoods, `acc_norm` divides each by the choice's length in
  characters (so long choices are not penalised for having more tokens);
- `format: letter` (the MMLU paper's prompt): the choices are listed as `A. …` in the prompt and
  the continuation is the letter (then acc == acc_norm).

Few-shot (`shots: k`): k solved questions go before each one, taken from the file's dev
counterpart (`dev_files`, same subject where it has them) or else the first k questions of each
subject, which are then not scored. Prompts are English or Chinese by the question's script.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from llmkit.errors import ConfigError, UserError
from llmkit.data.input_files import LETTERS, Question


@dataclass
class ChoiceConfig:
    files: list[str] = field(default_factory=list)      # question files (jsonl/json/parquet) or datasets
    dev_files: list[str] = field(default_factory=list)  # few-shot pools, one per file ([] = first k of each subject)
    shots: int = 0                          # solved examples before each question
    format: Literal["text", "letter"] = "text"  # score the choice's text, or its letter after a listing
    max_questions: int | None = None        # score at most this many questions per file

    def __post_init__(self):
        if self.shots < 0:
            raise ConfigError(f"choice.shots must be ≥ 0, got {self.shots}")
        if self.dev_files and len(self.dev_files) != len(self.files):
            raise ConfigError(f"choice.dev_files needs one file per choice.files entry "
                              f"({len(self.files)}), got {len(self.dev_files)}")
        if self.max_questions is not None and self.max_questions < 1:
            raise ConfigError(f"choice.max_questions must be ≥ 1, got {self.max_questions}")


# -- prompts ---------------------------------------------------------------------------------

def _subject_words(subject: str) -> str:
    return subject.replace("_", " ")


def header(q: Question, fmt: str) -> str:
    if fmt != "letter" or not q.subject:
        return ""
    if q.chinese:  # C-Eval's instruction
        return f"以下是中国关于{_subject_words(q.subject)}考试的单项选择题，请选出其中的正确答案。\n\n"
    return (f"The following are multiple choice questions (with answers) about "
            f"{_subject_words(q.subject)}.\n\n")


def question_prompt(q: Question, fmt: str) -> str:
    """The text before a choice's continuation."""
    if fmt == "letter":
        listing = "".join(f"\n{LETTERS[i]}. {c}" for i, c in enumerate(q.choices))
        return f"{q.question}{listing}\n" + ("答案：" if q.chinese else "Answer:")
    return f"问题：{q.question}\n答案：" if q.chinese else f"Question: {q.question}\nAnswer:"


def continuation(q: Question, i: int, fmt: str) -> str:
    text = LETTERS[i] if fmt == "letter" else q.choices[i]
    return text if q.chinese else " " + text


def context(q: Question, examples: list[Question], fmt: str) -> str:
    solved = [question_prompt(e, fmt) + continuation(e, e.answer, fmt) for e in examples]
    return header(q, fmt) + "".join(s + "\n\n" for s in solved) + question_prompt(q, fmt)


def pick_examples(q: Question, pool: list[Question], k: int) -> list[Question]:
    """The first k of the pool with q's subject, topped up from the rest of the pool."""
    if k == 0:
        return []
    same = [e for e in pool if e.subject == q.subject and e is not q]
    rest = [e for e in pool if e.subject != q.subject and e is not q]
    return (same + rest)[:k]


def split_first_shots(questions: list[Question], k: int) -> tuple[list[Question], list[Question]]:
    """(scored, pool): the first k questions of each subject become the few-shot pool."""
    seen: dict[str, int] = defaultdict(int)
    scored, pool = [], []
    for q in questions:
        (pool if seen[q.subject] < k else scored).append(q)
        seen[q.subject] += 1
    return scored, pool


# -- scoring ---------------------------------------------------------------------------------

def continuation_requests(tokenizer, ctx_text: str, conts: list[str], max_len: int):
    """(ids, n_targets) per continuation: the context after `Tokenizer.document_start_ids()`, the
    continuation's tokens the ones scored. The context is cut from the left to fit max_len."""
    ctx_ids = tokenizer.encode(ctx_text)
    requests = []
    for whole, cont in zip(tokenizer.encode_batch([ctx_text + c for c in conts]), conts):
        # encoding the joined text keeps the tokens a model saw in training at the seam
        cont_ids = whole[len(ctx_ids):] if whole[:len(ctx_ids)] == ctx_ids else tokenizer.encode(cont)
        ids = [*tokenizer.document_start_ids(), *ctx_ids, *cont_ids]
        if len(cont_ids) >= max_len:
            raise UserError(f"a choice of {len(cont_ids)} tokens does not fit in the model's "
                            f"max_seq_len={max_len}")
        requests.append((ids[-max_len:], len(cont_ids)))
    return requests


def choice_scores(scorer, tokenizer, questions: list[Question], pool: list[Question], shots: int,
                  fmt: str) -> list[np.ndarray]:
    """Summed log-likelihood of each choice of each question."""
    requests, sizes = [], []
    for q in questions:
        conts = [continuation(q, i, fmt) for i in range(len(q.choices))]
        requests += continuation_requests(tokenizer, context(q, pick_examples(q, pool, shots), fmt),
                                          conts, scorer.max_len)
        sizes.append(len(conts))
    flat = scorer.target_logprobs(requests)
    return np.split(flat, np.cumsum(sizes)[:-1]) if questions else []


def accuracy(questions: list[Question], scores: list[np.ndarray], fmt: str) -> dict:
    """acc (summed log-likelihood) and acc_norm (per character of the choice), overall and by subject."""
    hits = defaultdict(lambda: [0, 0, 0])  # subject -> [questions, acc hits, acc_norm hits]
    for q, s in zip(questions, scores):
        lengths = np.array([len(continuation(q, i, fmt)) for i in range(len(q.choices))])
        for key in ("", q.subject) if q.subject else ("",):
            hits[key][0] += 1
            hits[key][1] += int(np.argmax(s) == q.answer)
            hits[key][2] += int(np.argmax(s / lengths) == q.answer)

    def result(n, acc, acc_norm):
        return {"acc": acc / n, "acc_norm": acc_norm / n, "questions": n}

    n, acc, acc_norm = hits.pop("", [0, 0, 0])
    if n == 0:
        raise UserError("no questions left to score (all went to the few-shot pool?)")
    out = result(n, acc, acc_norm)
    if hits:
        out["by_subject"] = {s: result(*v) for s, v in sorted(hits.items())}
    return out


def evaluate_choice(scorer, tokenizer, questions: list[Question], cfg: ChoiceConfig,
                    dev: list[Question] | None = None) -> dict:
    """Accuracy on one file's questions; `dev` is its few-shot pool (None: first k per subject)."""
    pool = dev or []
    if dev is None and cfg.shots:
        questions, pool = split_first_shots(questions, cfg.shots)
    if cfg.max_questions is not None:
        questions = questions[:cfg.max_questions]
    scores = choice_scores(scorer, tokenizer, questions, pool, cfg.shots, cfg.format)
    return {**accuracy(questions, scores, cfg.format), "shots": cfg.shots, "format": cfg.format}
