"""Continued pretraining on Chinese with and without vocabulary extension (Makefile target `cpt-zh`).

    python cpt_zh.py split CLEAN_DATASET HELDOUT_FRACTION SEED OUT_DIR
    python cpt_zh.py seq-len WORKSPACE ORIGINAL_TOKENS EXTENDED_TOKENS SEQ_LEN
    python cpt_zh.py table WORKSPACE ORIGINAL EXTENDED SEEDS > table.json

split: the demo's Chinese documents -> OUT_DIR/zh_train.jsonl and zh_heldout.jsonl, held out by
the rule `llmkit extend-vocab` used (so no held-out text trained a new piece either); a held-out
document is cut to its first 400 characters (16 documents). seq-len: the extended run's sequence length that
holds the bytes of SEQ_LEN original tokens (the two token artifacts' tokens-per-byte ratio), so both
runs take the same bytes per step. table: per-byte validation loss (nats per UTF-8 byte of the
held-out text, `llmkit eval`'s bits_per_byte x ln 2) and training bytes/s (the median logged
tokens/s over the run's tokens per byte) of every run, before and after.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path


def split(clean: str, fraction: str, seed: str, out: str, docs: int = 16, chars: int = 400) -> None:
    import pyarrow.parquet as pq

    from llmkit.data.tokenizer_training import _hash01

    train, heldout = [], []
    for f in sorted(Path(clean).glob("part-*.parquet")):
        t = pq.read_table(f, columns=["id", "text", "lang"]).to_pydict()
        for doc_id, text, lang in zip(t["id"], t["text"], t["lang"]):
            if lang != "zh":
                continue
            if _hash01("heldout", int(seed), doc_id) < float(fraction):
                if len(heldout) < docs:
                    heldout.append({"id": doc_id, "text": text[:chars]})
            else:
                train.append({"id": doc_id, "text": text})
    Path(out).mkdir(parents=True, exist_ok=True)
    for name, rows in (("zh_train", train), ("zh_heldout", heldout)):
        with open(Path(out) / f"{name}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def tokens_per_byte(ws: Path, tokens: str, dataset: str = "zh_train") -> float:
    """Tokens of a token artifact (each document's end included) over the UTF-8 bytes of the dataset
    it tokenized."""
    import pyarrow.parquet as pq

    n_tokens = json.loads((ws / tokens / "manifest.json").read_text())["stats"]["tokens"]
    n_bytes = sum(len(t.encode("utf-8")) for f in sorted((ws / dataset).glob("part-*.parquet"))
                  for t in pq.read_table(f, columns=["text"]).column("text").to_pylist())
    return n_tokens / n_bytes


def seq_len(ws: str, original: str, extended: str, length: str) -> None:
    ratio = tokens_per_byte(Path(ws), extended) / tokens_per_byte(Path(ws), original)
    print(max(8, round(int(length) * ratio)))


def nats_per_byte(ws: Path, eval_name: str) -> float | None:
    reports = sorted((ws / "eval" / eval_name).glob("*.json"))
    for report in reports:
        found = _find_key(json.loads(report.read_text()), "bits_per_byte")
        if found is not None:
            return round(found * math.log(2), 4)
    return None


def _find_key(obj, key):
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        obj = list(obj.values())
    if isinstance(obj, list):
        for v in obj:
            found = _find_key(v, key)
            if found is not None:
                return found
    return None


def run_speed(ws: Path, run: str, per_byte: float) -> dict:
    records = [json.loads(line) for line in (ws / run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    speeds = [r["tokens_per_s"] for r in records if "tokens_per_s" in r]
    return {"tokens_per_s": round(statistics.median(speeds), 2),
            "bytes_per_s": round(statistics.median(speeds) / per_byte, 1),
            "train_loss_last": round(records[-1]["loss"], 4), "steps": records[-1]["step"]}


def table(ws: str, original: str, extended: str, seeds: str) -> None:
    ws = Path(ws)
    per_byte = {m: tokens_per_byte(ws, f"tokens-{m}") for m in (original, extended)}
    out = {"tokens_per_byte": {m: round(v, 4) for m, v in per_byte.items()},
           "before": {m: nats_per_byte(ws, f"bpb-{m}") for m in (original, extended)}, "runs": {}}
    for seed in seeds.split(","):
        for m in (original, extended):
            run = f"cpt-{m}-s{seed}"
            out["runs"][run] = {"nats_per_byte": nats_per_byte(ws, f"bpb-{run}"), **run_speed(ws, run, per_byte[m])}
    for seed in seeds.split(","):
        a, b = out["runs"][f"cpt-{original}-s{seed}"], out["runs"][f"cpt-{extended}-s{seed}"]
        if a.get("bytes_per_s") and b.get("bytes_per_s"):
            out[f"speedup_s{seed}"] = round(b["bytes_per_s"] / a["bytes_per_s"], 2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"split": split, "seq-len": seq_len, "table": table}[command](*args)
