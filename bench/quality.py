"""Benchmark: `llmkit quality` — held-out AUC per language, determinism, scoring speed.

The planted corpus (tests/data/quality_corpus.py: educational-style documents from the demo's
real text against generated spam, ads, keyword lists and boilerplate, Chinese and English) is
built into --work. The classifier trains on its train split; its test split — other source
rows, other template phrases — gives the held-out AUC per language.

- fastText (the default backend): trained twice with seed 0 (model bytes compared) and once
  with seed 1; then `llmkit quality` scores and filters the test split replicated to --mb
  megabytes of text (every copy a distinct row), in this process, one thread, --repeat times
  (--force); MB/s of UTF-8 text per CPU second, every run's figure and the median.
- with `--encoder RUN` (a checkpoint run), the hidden-state head as well: its held-out AUC,
  and its speed on the test split (one run: it is slow).

    python bench/quality.py [--work /tmp/qbench] [--mb 20] [--repeat 3] [--encoder RUN]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[0] = str(ROOT)  # not bench/, whose tokenize.py would shadow the standard library's


def ctx(ws: Path, *sets: str, inputs=None, out=None, force=False):
    from llmkit.core.context import StageContext

    return StageContext.create(workspace=ws, set_=list(sets), inputs=inputs, out=out,
                               force=force, stage="quality")


def train(ws: Path, files: dict, name: str, *sets: str, encoder: str | None = None) -> float:
    """Train classifier `name`; its CPU seconds."""
    from llmkit.data.quality import run_quality

    c = ctx(ws, *sets, force=True)  # a rerun of the bench measures training again
    t0 = time.process_time()
    run_quality(c, c.config(), good=[files["good_train"]], bad=[files["bad_train"]], model=name,
                encoder=encoder, train_only=True)
    return time.process_time() - t0


def held_out_auc(ws: Path, name: str, test: list[dict]) -> tuple[dict, float]:
    """({lang: AUC}, MB per CPU second) of classifier `name` on the test rows."""
    import numpy as np

    from llmkit.data.quality_classifier import auc, load_classifier

    texts = [r["text"] for r in test]
    clf = load_classifier(ws / name)
    t0 = time.process_time()
    scores = clf.score(texts)
    seconds = time.process_time() - t0
    labels = np.array([r["label"] for r in test])
    langs = np.array([r["lang"] for r in test])
    return ({lang: auc(scores[langs == lang], labels[langs == lang]) for lang in ("en", "zh")},
            sum(len(t.encode()) for t in texts) / 1e6 / seconds)


def replicated_dataset(ws: Path, test: list[dict], mb: float) -> float:
    """`docs`: the test rows copied until they hold `mb` MB of text; its MB."""
    import pyarrow as pa

    from llmkit.data.io import DatasetWriter
    from llmkit.core.workspace import Workspace

    rows, size, copy = [], 0, 0
    while size < mb * 1e6:
        for r in test:
            rows.append({"id": f"{r['id']}-{copy}", "text": r["text"], "source": r["kind"],
                         "lang": r["lang"]})
            size += len(r["text"].encode())
        copy += 1
    b = Workspace(ws).builder("docs", stage="ingest", config={}, quiet=True)
    with b:
        w = DatasetWriter(b.dir)
        w.write(pa.Table.from_pylist(rows))
        w.close()
    return size / 1e6


def stage_speed(ws: Path, name: str, mb: float, repeat: int) -> list[float]:
    """MB per CPU second of `llmkit quality --in docs --model name` (score + filter)."""
    from llmkit.data.quality import run_quality

    speeds = []
    for _ in range(repeat):
        c = ctx(ws, "group_by=lang", inputs=["docs"], out="docs_q", force=True)
        t0 = time.process_time()
        run_quality(c, c.config(), model=name)
        speeds.append(mb / (time.process_time() - t0))
    return speeds


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/llmkit-bench-quality"))
    p.add_argument("--mb", type=float, default=20.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--encoder", help="a checkpoint run: measure the hidden-state head too")
    p.add_argument("--quick", action="store_true", default=bool(os.environ.get("BENCH_QUICK")),
                   help="small sizes (`make bench` sets BENCH_QUICK=1): runs end to end, no figures to keep")
    args = p.parse_args()
    if args.quick:
        args.mb, args.repeat = 0.5, 1
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from tests.data.quality_corpus import build, write

    data = build()
    paths = {f.stem: str(f) for f in write(args.work / "corpus", {"train": data["train"]})}
    test = [{**r, "label": 1} for r in data["test"]["good"]] + \
           [{**r, "label": 0} for r in data["test"]["bad"]]
    ws = args.work / "ws"
    print(f"corpus: train {len(data['train']['good'])} good / {len(data['train']['bad'])} bad, "
          f"test {len(data['test']['good'])} good / {len(data['test']['bad'])} bad; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)

    seconds = train(ws, paths, "ft_a", "seed=0")
    train(ws, paths, "ft_b", "seed=0")
    train(ws, paths, "ft_seed1", "seed=1")
    model = ws / "ft_a" / "model.bin"
    print(f"fasttext: trained in {seconds:.2f} CPU s, {model.stat().st_size / 1e6:.1f} MB; "
          f"seed 0 twice: {sha(model)} {sha(ws / 'ft_b/model.bin')} "
          f"(identical: {sha(model) == sha(ws / 'ft_b/model.bin')}); seed 1: "
          f"{sha(ws / 'ft_seed1/model.bin')}", flush=True)
    aucs, _ = held_out_auc(ws, "ft_a", test)
    print("fasttext held-out AUC: " + ", ".join(f"{k} {v:.4f}" for k, v in aucs.items()))
    mb = replicated_dataset(ws, test, args.mb)
    speeds = stage_speed(ws, "ft_a", mb, args.repeat)
    print(f"fasttext `llmkit quality` on {mb:.1f} MB: median {statistics.median(speeds):.2f} "
          f"MB/CPU-s; runs: {', '.join(f'{s:.2f}' for s in speeds)}; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)

    if args.encoder:
        seconds = train(ws, paths, "hidden", "backend=hidden", encoder=args.encoder)
        aucs, speed = held_out_auc(ws, "hidden", test)
        print(f"hidden head on {args.encoder}: trained in {seconds:.1f} CPU s; held-out AUC: "
              + ", ".join(f"{k} {v:.4f}" for k, v in aucs.items())
              + f"; scoring {speed:.3f} MB/CPU-s; load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
