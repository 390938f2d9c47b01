"""Benchmark data for bench/gguf_quality.py's importance-matrix figures, from a finished demo workspace:
* `OUT_WS/calib`: a dataset of the demo's `clean` rows whose documents are not in the val split of
  its `tokens` (the calibration text of `--set imatrix.data=calib`);
* `OUT_WS/held_out.jsonl`: the val split's documents (`text`, `lang`), which neither the demo's
  pretraining nor the calibration saw: the held-out zh and en text the perplexities are measured on.

    python bench/imatrix_data.py /tmp/demo-final/ws /tmp/imatrix-bench/ws
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # bench/tokenize.py shadows tokenize
sys.path.insert(0, str(HERE.parent))


def main() -> None:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet  # noqa: F401 (pa.parquet)

    from llmkit.core.workspace import Workspace
    from llmkit.data.io import DatasetWriter, read_table

    demo, out = Path(sys.argv[1]), Path(sys.argv[2])
    index = pa.concat_tables([pa.parquet.read_table(f) for f in sorted((demo / "tokens" / "index").glob("*.parquet"))])
    held = set(index.filter(pc.equal(index["split"], "val"))["id"].to_pylist())
    clean = read_table(demo / "clean")
    is_held = pc.is_in(clean["id"], pa.array(sorted(held)))
    out.mkdir(parents=True, exist_ok=True)
    b = Workspace(out).builder("calib", stage="ingest", config={"from": str(demo / "clean"), "without": "tokens val"},
                               force=True, quiet=True)
    with b:
        w = DatasetWriter(b.dir)
        w.write(clean.filter(pc.invert(is_held)).select(["id", "text", "source", "lang"]))
        w.close()
    rows = clean.filter(is_held).select(["text", "lang"]).to_pylist()
    with (out / "held_out.jsonl").open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    langs = {lang: sum(r["lang"] == lang for r in rows) for lang in sorted({r["lang"] for r in rows})}
    print(f"calib: {len(clean) - len(rows)} rows; held_out.jsonl: {len(rows)} documents {langs}")


if __name__ == "__main__":
    main()
