"""`llmkit ablate EXPERIMENT.yaml --out NAME`: every variant × seed of an experiment through the
normal stages, then the results with their intervals.

The artifact `NAME/` is built in place: its manifest goes first and comes back last, and its
`runs/` folder holds the runs (each written there by its command's --out, with its log), so a
killed ablate keeps every finished run and the rerun picks up where it stopped. `run.json`
records the experiment while it runs (what marks the folder as llmkit's before its manifest).
Up to date means: the same experiment and inputs (the fingerprint), and every run's manifest
still the one results.json recorded.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from llmkit.ablate.experiment import AblateConfig, metric_label, read_experiment
from llmkit.ablate.plan import RUNS, Plan, make_plan
from llmkit.ablate.results import RESULTS, TABLE, metric_value, summarize, write_results
from llmkit.ablate.runs import Llmkit, run_all, run_command_line, threads_per_run
from llmkit.core.durable import write_atomic
from llmkit.core.progress import print_summary
from llmkit.core.targets import MANIFEST

RECORD = "run.json"


def run_ablate(ctx, cfg: AblateConfig, experiment: Path, llmkit: Llmkit):
    """`llmkit ablate`: the ablate artifact `ctx.out` (default "ablate"); `llmkit` runs one command
    line (the CLI's `main`)."""
    exp = read_experiment(Path(experiment))
    name = ctx.out_name("ablate")
    runs = ctx.workspace.path(name).resolve() / RUNS
    workspace = ctx.workspace.root.resolve()
    plan = make_plan(exp, ctx.workspace, runs)
    inputs = [ctx.workspace.artifact(p) for p in plan.inputs]
    b = ctx.workspace.builder(name, stage="ablate", config={"experiment": exp.record(), "confidence": cfg.confidence},
                              inputs=inputs, force=ctx.force, in_place=True, quiet=True)
    if b.up_to_date and runs_unchanged(b.final, plan):
        print(f"{name}: up to date ({b.final}): {len(plan.runs)} runs, nothing to do")
        return b
    with b:
        write_atomic(b.dir / RECORD, json.dumps({"stage": "ablate", "experiment": str(exp.path), "config": b.config,
                                                 "inputs": [{"path": str(a.path), "fingerprint": a.fingerprint}
                                                            for a in inputs]}, indent=1))
        steps_measured = {m[0] for m in exp.metrics}

        def check(run) -> None:  # a metric the stage does not record stops the experiment at its first run
            for m in exp.metrics:
                if run.step == m[0] and run.step in steps_measured:
                    metric_value(exp, runs, plan, run.name, m)

        outcome = run_all(plan, workspace, runs, llmkit, processes=cfg.processes, threads=cfg.threads, force=ctx.force,
                          finished=check)
        threads = threads_per_run(cfg.processes, cfg.threads)
        results = summarize(exp, plan, runs, cfg.confidence,
                            {r.name: run_command_line(r, workspace, runs, threads) for r in plan.runs})
        plots = write_results(results, b.dir, name)
        (b.dir / RECORD).unlink(missing_ok=True)
        trained = sum(1 for v in outcome.values() if v == "trained")
        b.stats.update(runs=len(plan.runs), trained=trained, cells=len(plan.cells), seeds=exp.seeds,
                       plots=[p.name for p in plots],
                       **{f"{label}/{variant}": entry["mean"] for label, metric in results["metrics"].items()
                          for variant, entry in metric["variants"].items()})
    print((b.final / TABLE).read_text(encoding="utf-8"))
    print_summary(f"ablate done: {b.final}", [
        ("runs", f"{len(plan.runs)} ({trained} trained, {len(plan.runs) - trained} up to date)"),
        ("variants × seeds", f"{len(exp.names)} × {len(exp.seeds)}"),
        ("metrics", ", ".join(metric_label(exp, m) for m in exp.metrics)),
        ("results", f"{b.final / RESULTS}, {b.final / TABLE}, {', '.join(p.name for p in plots)}"),
        ("seconds", round(time.time() - b.started, 1))])
    return b


def runs_unchanged(folder: Path, plan: Plan) -> bool:
    """Every run of `plan` has the manifest results.json recorded for it."""
    try:
        recorded = json.loads((folder / RESULTS).read_text(encoding="utf-8"))["runs"]
        runs = folder / RUNS
        return set(recorded) == {r.name for r in plan.runs} and all(
            json.loads((runs / r.name / MANIFEST).read_text(encoding="utf-8"))["fingerprint"]
            == recorded[r.name]["fingerprint"] for r in plan.runs)
    except (OSError, ValueError, KeyError, TypeError):
        return False
