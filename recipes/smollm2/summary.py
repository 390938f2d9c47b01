"""The SmolLM2 recipe's table, from what its stages recorded: the import's parity with
transformers; the task's held-out exact match before -> after SFT and DPO; and general ability
(held-out general questions, `general_eval.jsonl`) of the base, SFT and DPO models, so that a
task gained by forgetting what the model knew shows in the same table.

    python recipes/smollm2/summary.py WORKSPACE     # writes WORKSPACE/recipe/summary.json
"""

import json
import sys
from pathlib import Path

STAGES = ("sft", "dpo")
MODELS = ("smollm2", "sft", "dpo")  # the runs whose general ability is measured, base first
GENERAL = "general_eval"  # the files' names in the eval reports
LONGER_WORDS = "reversal_long"  # the task on words longer than any trained one


def manifest(ws: Path, name: str) -> dict:
    return json.loads((ws / name / "manifest.json").read_text())


def by_language(results: dict, metric: str) -> dict:
    """One metric of one eval file, by language and over all its rows."""
    out = {lang: {metric: r[metric], "examples": r["examples"]} for lang, r in results.items()}
    n = sum(r["examples"] for r in results.values())
    out["all"] = {metric: sum(r[metric] * r["examples"] for r in results.values()) / n, "examples": n}
    return out


def eval_report(ws: Path, run: str) -> dict:
    return json.loads((ws / "eval" / f"general-{run}" / "results.json").read_text())["generation"]


def summary(ws: Path) -> dict:
    parity = json.loads((ws / "recipe" / "parity.json").read_text())
    out = {"import": {"parameters": manifest(ws, "smollm2")["stats"]["parameters"],
                      "max_abs_logit_diff": parity["max_abs_logit_diff"], "tokens": parity["tokens"],
                      "replies": parity["replies"], "replies_equal": parity["replies_equal"]}}
    for stage in STAGES:
        m = manifest(ws, stage)
        out[stage] = {k: m["stats"].get(k) for k in ("steps", "eval_records", "base_accuracy", "accuracy",
                                                      "trainable_share")}
        out[stage]["seconds"] = m.get("seconds")
    reports = {run: eval_report(ws, run) for run in MODELS}
    # general ability: the share of replies holding the answer; longer words: exact match
    out["general"] = {run: by_language(r[GENERAL], "contains") for run, r in reports.items()}
    out["longer_words"] = {run: by_language(r[LONGER_WORDS], "exact_match") for run, r in reports.items()}
    return out


def figures_line(by_run: dict, lang: str, metric: str) -> str:
    figures = " -> ".join(f"{by_run[run][lang][metric]:.2f}" for run in MODELS)
    return f"{lang:<3} {figures} ({by_run[MODELS[0]][lang]['examples']} rows)"


if __name__ == "__main__":
    ws = Path(sys.argv[1])
    s = summary(ws)
    (ws / "recipe" / "summary.json").write_text(json.dumps(s, indent=2, ensure_ascii=False) + "\n")
    print(f"import  max |logit diff| vs transformers over {s['import']['tokens']} tokens: "
          f"{s['import']['max_abs_logit_diff']:.2e}; greedy replies equal: {s['import']['replies_equal']}")
    for stage in STAGES:
        r = s[stage]
        print(f"{stage:<6}  task: held-out exact match {r['base_accuracy']} -> {r['accuracy']} "
              f"({r['eval_records']} rows, {r['steps']} steps, {r['seconds']} s)")
    for key, metric, title in (("general", "contains", "general questions, share of replies holding the answer"),
                               ("longer_words", "exact_match", "the task on longer words, exact match")):
        print(f"{title}, base -> sft -> dpo:")
        for lang in [k for k in s[key][MODELS[0]] if k != "all"] + ["all"]:
            print("        " + figures_line(s[key], lang, metric))
