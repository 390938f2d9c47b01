"""`llmkit judge --export`: a session's journal as a preference dataset and a ranking.

The artifact holds one row per judgement that picked a side: `prompt`, `chosen`, `rejected`
(the columns `llmkit rm` and `llmkit dpo` read; `messages` too when the prompts were chats),
`id` (the judgement's), `rater`, `item`, `chosen_model`, `rejected_model`. Ties and skips are
no pair, nor is a side picked between two identical replies (nothing to learn: counted as
`identical_pairs`); a rater's repeated judgement of an item counts once, the first
(`llmkit.judge.journal.first_judgements`; counted as `repeats`). `judgements.jsonl` keeps every
judgement that counts, `ratings.jsonl` every reply a rater scored
(llmkit.judge.ratings), `ranked.jsonl` the ranked lists (`responses` best first, what `llmkit
ingest --kind preference` reads) where a rater's judgements of one prompt order all of three or
more models, `ranking.json` and `summary.md` the Bradley–Terry ranking, win rates, rater
agreement (`llmkit.judge.ranking`) and score means, which `llmkit report` plots.
"""

from __future__ import annotations

import hashlib
import json

from llmkit.data.io import DatasetWriter
from llmkit.errors import UserError
from llmkit.judge.journal import JOURNAL_FILE, first_judgements, read_journal
from llmkit.judge.ranking import RANKING_FILE, ranking_markdown, summarize
from llmkit.judge.ratings import rating_rows
from llmkit.judge.session import EXPORT_KIND, JudgeConfig, read_items, refuse_while_judged, unmarked_export

JUDGEMENTS_FILE, RATINGS_FILE, RANKED_FILE = "judgements.jsonl", "ratings.jsonl", "ranked.jsonl"


def prompt_text(prompt) -> str:
    """A chat prompt's last user turn; a text prompt as it is."""
    return [m["content"] for m in prompt if m["role"] == "user"][-1] if isinstance(prompt, list) else prompt


def same_replies(item: dict) -> bool:
    """Whether an item's two replies are the same text (models that agree word for word)."""
    return item["left"].strip() == item["right"].strip()


def preference_rows(judgements: list[dict], items: dict[str, dict], source: str) -> list[dict]:
    """A chosen/rejected row per judgement of a side between different replies, in the
    journal's order."""
    rows = []
    for j in judgements:
        if j["choice"] not in ("left", "right") or same_replies(items[j["item"]]):
            continue
        item = items[j["item"]]
        won, lost = ("left", "right") if j["choice"] == "left" else ("right", "left")
        prompt = item["prompt"]
        chat = isinstance(prompt, list)
        text = prompt_text(prompt)
        rows.append({"id": j["id"], "prompt": text, **({"messages": prompt} if chat else {}),
                     "chosen": item[won], "rejected": item[lost], "text": f"{text}\n{item[won]}",
                     "source": source, "rater": j["rater"], "item": j["item"],
                     "chosen_model": item[f"{won}_model"], "rejected_model": item[f"{lost}_model"]})
    return rows


def ranked_lists(judgements: list[dict], items: dict[str, dict], models: list[str]) -> list[dict]:
    """Per rater and prompt whose left/right choices cover every pair of three or more models
    without a cycle: the replies best first (a model that beat k others is ranked above one
    that beat fewer; the order is total exactly when those counts are all different)."""
    if len(models) < 3:
        return []  # two models: the list is the pair itself
    wins: dict[tuple[str, str], dict[str, int]] = {}
    replies: dict[tuple[str, str], dict[str, str]] = {}
    prompts, judged = {}, {}
    pairs_needed = len(models) * (len(models) - 1) // 2
    for j in judgements:
        item = items[j["item"]]
        key = (j["rater"], item["prompt_id"])
        prompts[key] = item["prompt"]
        replies.setdefault(key, {}).update({item[f"{s}_model"]: item[s] for s in ("left", "right")})
        judged[key] = judged.get(key, 0) + 1
        counts = wins.setdefault(key, dict.fromkeys(models, 0))
        if j["choice"] in ("left", "right"):
            counts[item[f"{j['choice']}_model"]] += 1
    out = []
    for key, counts in wins.items():
        if judged[key] != pairs_needed or sorted(counts.values()) != list(range(len(models))) \
                or len({r.strip() for r in replies[key].values()}) < len(models):
            continue  # a pair unjudged, a tie or skip, a cycle, or one reply twice: no total order
        order = sorted(models, key=lambda m: -counts[m])
        out.append({"prompt": prompt_text(prompts[key]), "responses": [replies[key][m] for m in order],
                    "models": order, "rater": key[0], "prompt_id": key[1]})
    return out


def write_jsonl(path, records: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def write_preferences(directory, rows: list[dict]) -> None:
    import pyarrow as pa

    writer = DatasetWriter(directory)
    writer.write(pa.Table.from_pylist(rows))
    writer.close()


def run_export(ctx, cfg: JudgeConfig):
    """The export artifact `--out` (default `judge_prefs`) of session `--in` (default `judge`)."""
    session = ctx.input(default="judge")
    items = {item["id"]: item for item in read_items(session.path)}
    journal = session.path / JOURNAL_FILE
    judgements, repeats = first_judgements([j for j in read_journal(journal) if j["item"] in items])
    raters = [r.strip() for r in cfg.raters.split(",") if r.strip()]
    if raters:
        judged_by = {j["rater"] for j in judgements}
        unknown = [r for r in raters if r not in judged_by]
        if unknown:
            raise UserError(f"raters={cfg.raters}: {', '.join(unknown)} judged nothing in {session.path}; "
                            f"its raters: {', '.join(sorted(judged_by)) or 'none'}")
        judgements = [j for j in judgements if j["rater"] in raters]
    if not judgements:
        raise UserError(f"{session.path} has no judgements yet; judge with `llmkit judge --in "
                        f"{session.name}` first")
    out = ctx.out_name("judge_prefs")
    if ctx.workspace.path(out).resolve() == session.path.resolve():
        raise UserError(f"--out {out} is the session itself; name another artifact")
    # the journal grows under a session whose own fingerprint stays: its content is an input
    settings = {"resamples": cfg.resamples, "seed": cfg.seed, "judgements": len(judgements),
                "journal_sha256": hashlib.sha256(
                    "".join(j["id"] + j["choice"] for j in judgements).encode()).hexdigest(),
                **({"raters": raters} if raters else {})}  # absent when all: earlier exports stay up to date
    final = ctx.workspace.path(out)
    refuse_while_judged(final)  # a session served now, even with --force
    b = ctx.workspace.builder(out, stage="judge", kind=EXPORT_KIND, config=settings, inputs=[session],
                              force=ctx.force or unmarked_export(final))
    if b.up_to_date:
        return b
    with b:
        rows = preference_rows(judgements, items, f"judge:{session.name}")
        identical = sum(j["choice"] in ("left", "right") and same_replies(items[j["item"]])
                        for j in judgements)
        write_preferences(b.dir, rows)
        models = session.config["models"]
        ratings, ranked = rating_rows(judgements, items), ranked_lists(judgements, items, models)
        write_jsonl(b.dir / JUDGEMENTS_FILE, judgements)
        write_jsonl(b.dir / RATINGS_FILE, ratings)
        write_jsonl(b.dir / RANKED_FILE, ranked)
        summary = summarize(judgements, models, cfg.resamples, cfg.seed)
        (b.dir / RANKING_FILE).write_text(json.dumps(summary, indent=2, ensure_ascii=False))
        (b.dir / "summary.md").write_text(ranking_markdown(summary, f"Judgements of {session.name}"))
        b.stats = {"judgements": len(judgements), "pairs": len(rows), "rows": len(rows),
                   "ties": sum(j["choice"] == "tie" for j in judgements),
                   "skips": sum(j["choice"] == "skip" for j in judgements),
                   "identical_pairs": identical, "repeats": repeats,
                   "raters": len({j["rater"] for j in judgements}),
                   "rated_replies": len(ratings), "ranked_lists": len(ranked),
                   "ranking": [r["model"] for r in summary["ranking"]]}
    left_out = "".join(f"; {n} {what} left out" for n, what in (
        (identical, "sides picked between identical replies"), (repeats, "repeated judgements")) if n)
    print(f"{out}: {len(rows)} preference pairs from {len(judgements)} judgements{left_out}; ranking "
          + " > ".join(f"{r['model']} ({r['score']:+.2f})" for r in summary["ranking"]))
    return b
