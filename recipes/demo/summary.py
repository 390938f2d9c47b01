"""Gather the demo's figures from the artifacts' manifests into workspace/demo/summary.json.

Every number here was recorded by the stage that produced it; this script only collects them
and prints one table.
"""

import json
import sys
from pathlib import Path

from llmkit.train.threads import threads_label


def stats(ws: Path, name: str) -> dict:
    path = ws / name / "manifest.json"
    return json.loads(path.read_text())["stats"] if path.is_file() else {}


def seconds(ws: Path) -> float:
    total = 0.0
    for mf in ws.rglob("manifest.json"):
        total += json.loads(mf.read_text()).get("seconds", 0.0)
    return round(total, 1)


METHODS = ("kto", "orpo", "simpo", "rloo")
RUNS = ("pretrain", "sft", "rm", "dpo", "ppo", *METHODS)  # the training runs


def summary(ws: Path) -> dict:
    def pick(name, *keys):
        s = stats(ws, name)
        return {k: s.get(k) for k in keys}

    sft, dpo, ppo = stats(ws, "sft"), stats(ws, "dpo"), stats(ws, "ppo")
    return {
        "data": {name: stats(ws, name).get("rows_out") for name in
                 ("raw", "clean", "dedup", "filtered", "decontaminated")},
        "data_removed": {name: stats(ws, name).get("removed_by_reason") for name in
                         ("raw", "clean", "dedup", "filtered", "decontaminated")},
        "tokens": stats(ws, "tokens").get("tokens"),
        "pretrain": pick("pretrain", "val_loss", "steps", "final_loss", "tokens_per_s", "mfu"),
        "sft": {"base_accuracy": sft.get("base_accuracy"), "accuracy": sft.get("accuracy")},
        "rm": pick("rm", "base_accuracy", "accuracy"),
        "dpo": {"base_accuracy": dpo.get("base_accuracy"), "accuracy": dpo.get("accuracy"),
                "reward_margin": dpo.get("reward_margin")},
        "ppo": {"base_accuracy": ppo.get("base_accuracy"), "accuracy": ppo.get("accuracy"),
                "base_similarity": ppo.get("base_similarity"), "similarity": ppo.get("similarity"),
                "reward_start": ppo.get("reward_start"), "reward_end": ppo.get("reward_end")},
        # the other preference methods, when `make -C recipes/demo methods` ran them
        "methods": {m: {"base_accuracy": stats(ws, m).get("base_accuracy"),
                        "accuracy": stats(ws, m).get("accuracy")}
                    for m in METHODS if stats(ws, m)},
        "eval": stats(ws, "eval/sft"),
        "export": {"max_abs_logit_diff": stats(ws, "export/hf").get("max_abs_logit_diff")},
        # what each training run computed on: its CPU threads (count, changes) and kernels
        "threads": {name: {k: stats(ws, name).get(k) for k in ("threads", "cpu_kernels")}
                    for name in RUNS if stats(ws, name)},
        "seconds": seconds(ws),
    }


def table(s: dict) -> str:
    def f(v):
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    d = s["data"]
    rows = [
        ("data rows raw → clean → dedup → filtered → decontaminated",
         " → ".join(f(d[k]) for k in ("raw", "clean", "dedup", "filtered", "decontaminated"))),
        ("tokens", f(s["tokens"])),
        ("pretrain steps / val loss", f"{f(s['pretrain']['steps'])} / {f(s['pretrain']['val_loss'])}"),
        ("sft exact match (base → sft)",
         f"{f(s['sft']['base_accuracy'])} → {f(s['sft']['accuracy'])}"),
        ("rm pairwise accuracy", f(s["rm"]["accuracy"])),
        ("dpo exact match (sft → dpo)",
         f"{f(s['dpo']['base_accuracy'])} → {f(s['dpo']['accuracy'])}"),
        ("ppo exact match (sft → ppo)",
         f"{f(s['ppo']['base_accuracy'])} → {f(s['ppo']['accuracy'])}"),
        ("ppo answer similarity (sft → ppo)",
         f"{f(s['ppo']['base_similarity'])} → {f(s['ppo']['similarity'])}"),
        ("ppo reward (start → end)", f"{f(s['ppo']['reward_start'])} → {f(s['ppo']['reward_end'])}"),
        *((f"{m} exact match (sft → {m})", f"{f(r['base_accuracy'])} → {f(r['accuracy'])}")
          for m, r in s["methods"].items()),
        ("export max |Δlogit| vs transformers", f(s["export"]["max_abs_logit_diff"])),
        ("training CPU threads, kernels", "; ".join(f"{name} {threads_label(t['threads']) or '?'} "
                                                    f"{t['cpu_kernels'] or '?'}" for name, t in s["threads"].items())),
        ("stage seconds (sum)", f(s["seconds"])),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


if __name__ == "__main__":
    ws = Path(sys.argv[1])
    s = summary(ws)
    (ws / "demo").mkdir(parents=True, exist_ok=True)
    (ws / "demo" / "summary.json").write_text(json.dumps(s, indent=2, ensure_ascii=False) + "\n")
    print(table(s))
    print(f"\nwritten: {ws / 'demo' / 'summary.json'}")
