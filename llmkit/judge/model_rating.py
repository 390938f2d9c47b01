"""`llmkit judge --model RUN`: a model rates a session's items into its journal, as a rater.

One journal record per item, rater `model:RUN`, its choice (left, right or tie) and, under
`model_judge`, both orders' verdicts and label probabilities (llmkit.judge.model_judge), fsynced
in chunks as they come, so a killed run resumes where it stopped and a rerun judges nothing.
Exports and rankings count them like any rater's (`--set raters=` picks raters); the summary
printed at the end sets the judge beside the human raters (llmkit.judge.agreement).
"""

from __future__ import annotations

import sys

from llmkit.judge.agreement import judge_summary, judge_summary_markdown
from llmkit.judge.journal import JOURNAL_FILE, Journal, first_judgements, read_journal
from llmkit.judge.model_judge import ModelJudgeConfig, judge_pairs
from llmkit.judge.session import read_items
from llmkit.checkpoints.loading import load
from llmkit.model.lm_scoring import resolve_device

SIDE = {"a": "left", "b": "right", "tie": "tie"}  # the session's left reply is judged as reply a


def run_model_judge(ctx, cfg, judge_run: str, session) -> dict:
    """`llmkit judge --model RUN`: judge every item of `session` (an Artifact) that RUN's rater
    has not judged yet, into the session's journal; the judge summary (llmkit.judge.agreement)
    of what the journal now holds."""
    mj = cfg.model_judge
    rater = mj.rater or f"model:{judge_run}"
    items = read_items(session.path)
    ctx.workspace.artifact(judge_run)  # a missing run is named before the journal is opened
    journal = Journal(session.path / JOURNAL_FILE)
    try:
        done = journal.judged_by(rater)
        todo = [item for item in items if item["id"] not in done]
        if todo:
            judge_items(ctx, mj, judge_run, rater, todo, journal)
        else:
            print(f"judge: {rater} has judged all {len(items)} items of {session.name}: up to date",
                  file=sys.stderr)
    finally:
        journal.close()
    judgements, _ = first_judgements(read_journal(session.path / JOURNAL_FILE))
    summary = judge_summary([j for j in judgements if j["item"] in {i["id"] for i in items}])
    print(judge_summary_markdown(summary, f"Model judge on {session.name}"))
    return summary


def judge_items(ctx, mj: ModelJudgeConfig, judge_run: str, rater: str, todo: list[dict], journal) -> None:
    model, tokenizer = load(judge_run, device=resolve_device(mj.device), workspace=ctx.workspace.root)
    print(f"judge: {rater} judges {len(todo)} items (both orders)", file=sys.stderr)
    step = max(mj.batch_size, 1) * 4  # journalled in chunks: a kill loses at most one chunk's work
    for start in range(0, len(todo), step):
        chunk = todo[start:start + step]
        verdicts = judge_pairs(model, tokenizer, [(i["prompt"], i["left"], i["right"]) for i in chunk], mj)
        for item, v in zip(chunk, verdicts):
            record = v.as_record(SIDE)
            journal.append({"rater": rater, "item": item["id"], "choice": record.pop("choice"),
                            "left_model": item["left_model"], "right_model": item["right_model"],
                            "model_judge": {"model": judge_run, "combine": mj.combine, "ties": mj.ties, **record}})
