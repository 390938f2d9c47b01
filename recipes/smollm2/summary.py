"""The SmolLM2 recipe's table, from what its stages recorded: the import's parity with
transformers, and held-out exact match before -> after SFT and DPO.

    python recipes/smollm2/summary.py WORKSPACE     # writes WORKSPACE/recipe/summary.json
"""

import json
import sys
from pathlib import Path


def manifest(ws: Path, name: str) -> dict:
    return json.loads((ws / name / "manifest.json").read_text())


def summary(ws: Path) -> dict:
    parity = json.loads((ws / "recipe" / "parity.json").read_text())
    out = {"import": {"parameters": manifest(ws, "smollm2")["stats"]["parameters"],
                      "max_abs_logit_diff": parity["max_abs_logit_diff"], "tokens": parity["tokens"],
                      "replies": parity["replies"], "replies_equal": parity["replies_equal"]}}
    for stage in ("sft", "dpo"):
        m = manifest(ws, stage)
        out[stage] = {k: m["stats"].get(k) for k in ("steps", "eval_records", "base_accuracy", "accuracy",
                                                      "trainable_share")}
        out[stage]["seconds"] = m.get("seconds")
    return out


if __name__ == "__main__":
    ws = Path(sys.argv[1])
    s = summary(ws)
    (ws / "recipe" / "summary.json").write_text(json.dumps(s, indent=2, ensure_ascii=False) + "\n")
    print(f"import  max |logit diff| vs transformers over {s['import']['tokens']} tokens: "
          f"{s['import']['max_abs_logit_diff']:.2e}; greedy replies equal: {s['import']['replies_equal']}")
    for stage in ("sft", "dpo"):
        r = s[stage]
        print(f"{stage:<6}  held-out exact match {r['base_accuracy']} -> {r['accuracy']} "
              f"({r['eval_records']} rows, {r['steps']} steps, {r['seconds']} s)")
