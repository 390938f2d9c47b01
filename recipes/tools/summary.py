"""Held-out accuracy of the calculator demo's runs: `python recipes/tools/summary.py WS`.

With the tool: grpo_tool's greedy answers with the calculator executed (math equivalence), at its
start (the SFT model) and after GRPO. Without it: grpo_direct's greedy answers (exact match), the
same questions answered by the model trained to answer at once, before and after its own GRPO."""

import json
import sys
from pathlib import Path


def stats(ws: Path, run: str) -> dict:
    manifest = ws / run / "manifest.json"
    return json.loads(manifest.read_text())["stats"] if manifest.is_file() else {}


def main() -> None:
    ws = Path(sys.argv[1])
    tool, direct = stats(ws, "grpo_tool"), stats(ws, "grpo_direct")
    rows = [("with the calculator", tool.get("base_tool_accuracy"), tool.get("tool_accuracy")),
            ("tool model, calls not run", tool.get("base_accuracy"), tool.get("accuracy")),
            ("without it (direct answers)", direct.get("base_accuracy"), direct.get("accuracy"))]
    print(f"{'held-out accuracy':32} {'SFT':>6} {'GRPO':>6}")
    for name, before, after in rows:
        show = lambda x: "n/a" if x is None else f"{x:.3f}"  # noqa: E731
        print(f"{name:32} {show(before):>6} {show(after):>6}")
    (ws / "tools_summary.json").write_text(json.dumps({n: [b, a] for n, b, a in rows}, indent=1))


if __name__ == "__main__":
    main()
