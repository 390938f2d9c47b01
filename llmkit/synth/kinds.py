"""The five kinds of data `llmkit synth` makes, each a function from a task's input rows to its
kept rows and its removed rows (each removed row with its `reason`).

A kind only asks its generator (`complete`, `yes_probability`; llmkit.synth.engine or .client)
and its judge: a scripted one in a test, a model in a run. Every candidate it makes is kept or
removed, so a task's `rows_in` (its candidates) is its rows kept plus removed.

- instructions (Magpie): the chat template's user-turn prefix alone; the model writes the user
  turn. Kept when it is one user turn (`prompts.parse_instruction`). Rows: a prompt dataset.
- answers: `n` replies to each prompt (a prompt dataset, or sft rows: their turns before the
  reply). Rows: an sft dataset (`messages`, and `prompt`/`response` of the last turn).
- qa: a question and its answer from each document, kept when the judge finds the answer
  supported by the document (`grounding`). Rows: an sft dataset.
- rephrase: each document rewritten in each of `styles`. Rows: a text dataset.
- pairs: two replies to each prompt, the judge's preferred one `chosen`. Rows: a preference dataset.
"""

from __future__ import annotations

from llmkit.data.chat import prompt_messages
from llmkit.synth.prompts import (GROUNDING, QA, REPHRASE, WITH_DOCUMENT, WITHOUT_DOCUMENT, language_of_row,
                                  parse_instruction, parse_qa)
from llmkit.synth.requests import Sampling

# columns a kind writes itself: an input row's other columns (answer, task, lang…) are carried
OWN = {"id", "text", "source", "prompt", "response", "messages", "chosen", "rejected", "reason",
       "style", "document_id", "sample", "support", "margin", "new_tokens"}


def instructions(first: int, count: int, gen, cfg, seed: int, source: str):
    """Instructions `first` … `first + count - 1` of the run."""
    prefix = gen.user_turn_prefix()
    kept, removed = [], []
    for i, c in enumerate(gen.complete([prefix] * count, Sampling.of(cfg), seed)):
        text, rid = c.text.strip(), f"instruction-{first + i:07d}"
        reason = parse_instruction(text, c.stopped, c.special)
        if reason:
            removed.append({"id": rid, "text": c.text, "source": source, "reason": reason})
        else:
            kept.append({"id": rid, "prompt": text, "text": text, "source": source,
                         "new_tokens": c.new_tokens})
    return kept, removed


def answers(rows: list[dict], gen, cfg, seed: int, source: str):
    turns = [prompt_messages(r) for r in rows]
    replies = gen.complete([t for t in turns for _ in range(cfg.n)], Sampling.of(cfg), seed)
    kept, removed = [], []
    for k, c in enumerate(replies):
        row, chat, sample = rows[k // cfg.n], turns[k // cfg.n], k % cfg.n
        rid = row["id"] if cfg.n == 1 else f"{row['id']}-{sample}"
        reason = _reply_problem(c, cfg)
        if reason:
            removed.append({"id": rid, "text": c.text, "source": source, "reason": reason})
            continue
        kept.append({"id": rid, **carried(row),
                     "messages": chat + [{"role": "assistant", "content": c.text}],
                     "prompt": chat[-1]["content"], "response": c.text,
                     "text": f"{chat[-1]['content']}\n{c.text}", "source": source,
                     "sample": sample, "new_tokens": c.new_tokens})
    return kept, removed


def qa(rows: list[dict], gen, judge, cfg, seed: int, source: str):
    docs = [(r.get("text") or "")[:cfg.max_document_chars] for r in rows]
    langs = [language_of_row(r, cfg.language) for r in rows]
    asked = [[{"role": "user", "content": QA[lang].format(document=doc)}] for doc, lang in zip(docs, langs)]
    replies = gen.complete(asked, Sampling.of(cfg), seed)
    kept, removed, found = [], [], []
    for row, doc, lang, c in zip(rows, docs, langs, replies):
        rid = f"{row['id']}-qa"
        parsed = _reply_problem(c, cfg) or parse_qa(c.text)
        if isinstance(parsed, str):
            removed.append({"id": rid, "text": c.text, "source": source, "reason": parsed,
                            "document_id": row["id"]})
        else:
            found.append((row, doc, lang, rid, *parsed))
    support = grounding(found, judge, cfg) if found else []
    least = cfg.min_support if cfg.grounding == "ask" else cfg.min_gain
    for (row, _, _, rid, q, a), p in zip(found, support):
        common = {"id": rid, "source": source, "document_id": row["id"], "support": round(p, 6)}
        if p >= least:
            kept.append({**common, **carried(row), "prompt": q, "response": a, "text": f"{q}\n{a}",
                         "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
        else:
            removed.append({**common, "text": f"{q}\n{a}", "reason": "unsupported_answer"})
    return kept, removed


def grounding(found: list, judge, cfg) -> list[float]:
    """Each answer's support by its document: the judge's P(yes) to the grounding question
    (`ask`), or how much the document raises the answer's log-likelihood per token
    (`likelihood`: nats; a 135M model that cannot answer the question still copies)."""
    if cfg.grounding == "ask":
        return judge.yes_probability([
            [{"role": "user", "content": GROUNDING[lang].format(document=doc, question=q, answer=a)}]
            for _, doc, lang, _, q, a in found])
    answers = [a for *_, a in found]
    read = judge.answer_logprobs([[{"role": "user", "content": WITH_DOCUMENT[lang].format(document=doc, question=q)}]
                                  for _, doc, lang, _, q, _ in found], answers)
    unread = judge.answer_logprobs([[{"role": "user", "content": WITHOUT_DOCUMENT[lang].format(question=q)}]
                                    for _, _, lang, _, q, _ in found], answers)
    return [r - u for r, u in zip(read, unread)]


def rephrase(rows: list[dict], gen, cfg, seed: int, source: str):
    asked = [(row, style, [{"role": "user", "content": REPHRASE[style][language_of_row(row, cfg.language)]
                            .format(document=(row.get("text") or "")[:cfg.max_document_chars])}])
             for row in rows for style in cfg.styles]
    replies = gen.complete([chat for _, _, chat in asked], Sampling.of(cfg), seed)
    kept, removed = [], []
    for (row, style, _), c in zip(asked, replies):
        common = {"id": f"{row['id']}-{style}", "source": source, "style": style, "document_id": row["id"]}
        reason = _reply_problem(c, cfg)
        if reason:
            removed.append({**common, "text": c.text, "reason": reason})
        else:
            kept.append({**common, **carried(row), "text": c.text.strip(), "new_tokens": c.new_tokens})
    return kept, removed


def pairs(rows: list[dict], gen, judge, cfg, seed: int, source: str):
    """Two replies to each prompt; `judge.margins(prompts, first, second)` is > 0 where the first
    is better, < 0 where the second is, 0 for a tie (removed: `tie`)."""
    turns = [prompt_messages(r) for r in rows]
    replies = gen.complete([t for t in turns for _ in range(2)], Sampling.of(cfg), seed)
    first, second = [c.text for c in replies[0::2]], [c.text for c in replies[1::2]]
    distinct = [k for k in range(len(rows)) if first[k].strip() != second[k].strip()]
    margins = dict(zip(distinct, judge.margins([turns[k] for k in distinct], [first[k] for k in distinct],
                                               [second[k] for k in distinct]))) if distinct else {}
    kept, removed = [], []
    for k, (row, chat) in enumerate(zip(rows, turns)):
        margin = margins.get(k)
        if margin is None or margin == 0:
            removed.append({"id": row["id"], "text": f"{first[k]}\n{second[k]}", "source": source,
                            "reason": "identical_replies" if margin is None else "tie"})
            continue
        chosen, rejected = (first[k], second[k]) if margin > 0 else (second[k], first[k])
        kept.append({"id": row["id"], **carried(row), "prompt": chat[-1]["content"], "chosen": chosen,
                     "rejected": rejected, "text": f"{chat[-1]['content']}\n{chosen}", "source": source,
                     "margin": round(abs(float(margin)), 6)})
    return kept, removed


def _reply_problem(c, cfg) -> str | None:
    if not c.text.strip():
        return "empty_reply"
    if not c.stopped and not cfg.keep_truncated:
        return "cut_at_max_new_tokens"
    return None


def carried(row: dict) -> dict:
    """An input row's own columns (an eval `answer`, `task`, `lang`…), passed through."""
    return {k: v for k, v in row.items() if k not in OWN}
