"""What each step of the web recipe removed, a row per reason, from the artifacts' manifests;
written to WS/web/summary.md and printed.

    python recipes/web/summary.py WS
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STEPS = {"ingest": "raw", "clean": "clean", "dedup": "dedup"}  # stage -> its artifact


def stats(ws: Path, step: str) -> dict:
    return json.loads((ws / step / "manifest.json").read_text())["stats"]


def removed_rows(ws: Path) -> list[str]:
    lines = ["| step | rows in | reason | rows removed | rows out |", "|---|---:|---|---:|---:|"]
    for step, artifact in STEPS.items():
        s = stats(ws, artifact)
        reasons = sorted(s["removed_by_reason"].items(), key=lambda kv: (-kv[1], kv[0]))
        for i, (reason, n) in enumerate(reasons):
            first, last = i == 0, i == len(reasons) - 1
            lines.append(f"| {step if first else ''} | {s['rows_in'] if first else ''} | "
                         f"`{reason}` | {n} | {s['rows_out'] if last else ''} |")
    return lines


def edited_rows(ws: Path) -> list[str]:
    """What clean changed inside the documents it kept."""
    s = stats(ws, "clean")
    lines = []
    if s.get("line_dedup"):
        ld = s["line_dedup"]
        lines.append(f"- line dedup: {ld['lines_cut']} lines cut, {ld['frequent_lines']} distinct "
                     "lines frequent across the corpus")
    if s.get("pii_redacted"):
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(s["pii_redacted"].items()))
        lines.append(f"- PII redacted in kept rows: {kinds}")
    return lines


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__.rsplit("\n\n", 1)[1].strip())
    ws = Path(sys.argv[1])
    text = "\n".join(removed_rows(ws) + [""] + edited_rows(ws)) + "\n"
    (ws / "web").mkdir(exist_ok=True)
    (ws / "web" / "summary.md").write_text(text, encoding="utf-8")
    print(text, end="")


if __name__ == "__main__":
    main()
