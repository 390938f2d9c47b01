"""`llmkit merge`, measured: its tensors against mergekit 0.1.5's, and checkpoint averaging of a
demo-size pretraining against its last step.

    python bench/merge.py parity [--scratch DIR]
    python bench/merge.py average WORKSPACE [--seeds 0,1 --last 2,3 --save-every 25 --set KEY=VALUE --tag T]

parity: for a tiny Llama and a tiny Qwen2 (a base and two fine-tunes of it, saved by transformers
and imported), each method through `llmkit merge` and through mergekit's run_merge on the same
folders (DARE: the same seed); prints the largest absolute difference over every tensor.

average: WORKSPACE holds the demo's `tokens` (and `tokenizer`); for each seed, the demo recipe's
pretraining with a checkpoint every --save-every steps (keeping the last max(--last)), then for each
K of --last `merge --method average --set last=K`, and `llmkit eval` (perplexity on the tokens' val
split) of the last step and of each average; prints the val losses (nats per token) and the
difference.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:] = [str(REPO)] + [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]


def parity(scratch: Path) -> None:
    from llmkit.checkpoints import step_folders as ckpt
    from tests.merge.test_stage import CASES, FAMILIES, llmkit, mergekit_merge, save_model
    from tests.tokenizers.test_tokenizer_json import QWEN_SPECIALS, train_bpe

    backend = train_bpe(QWEN_SPECIALS)
    print("| family | method | tensors | max abs diff (llmkit - mergekit) |\n|---|---|---|---|")
    for family in FAMILIES:
        root = scratch / family
        folders = {"base": save_model(root / "base", backend, family, 0)}
        for seed, name in enumerate(["a", "b"], start=1):
            folders[name] = save_model(root / name, backend, family, seed, base=folders["base"])
        ws = root / "ws"
        for name, folder in folders.items():
            assert llmkit("import", "--from", folder, "--out", name, "-w", ws).exit_code == 0
        for method, (extra, args) in CASES.items():
            r = llmkit("merge", "--method", method, *args, "--out", method, "-w", ws)
            assert r.exit_code == 0, r.output
            ours, _ = ckpt.load_weights(ws / method)
            theirs = mergekit_merge(method, folders, root / f"mergekit_{method}", extra)
            diff = max((ours[k] - theirs[k]).abs().max().item() for k in theirs)
            print(f"| {family} | {method} | {len(theirs)} | {diff:.3g} |", flush=True)


def cli(*args) -> subprocess.CompletedProcess:
    done = subprocess.run([str(Path(sys.executable).parent / "llmkit"), *map(str, args)], capture_output=True,
                          text=True)
    if done.returncode:
        sys.exit(f"llmkit {' '.join(map(str, args))} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return done


def val_loss(ws: Path, run: str, step: str | None, out: str) -> float:
    args = ["--set", f"step={step}"] if step else []
    cli("eval", "--from", run, "-w", ws, "--out", out, "--force", *args)
    return json.loads((ws / "eval" / out / "results.json").read_text())["ppl"]["tokens:val"]["nll_per_token"]


def average(ws: Path, seeds: list[int], lasts: list[int], save_every: int, settings: list[str], tag: str) -> None:
    print("| seed | steps averaged | val loss, last step | val loss, average | average - last |\n|---|---|---|---|---|")
    for seed in seeds:
        run = f"pre{tag}_s{seed}"
        cli("pretrain", "--recipe", REPO / "recipes/demo/recipe.yaml", "-w", ws, "--in", "tokens", "--out", run,
            "--set", f"save_every={save_every}", "--set", f"seed={seed}", "--set", f"keep_last={max(lasts)}",
            *[a for kv in settings for a in ("--set", kv)])
        final = val_loss(ws, run, None, f"{run}_last")
        for last in lasts:
            soup = f"{run}_avg{last}"
            cli("merge", "--method", "average", "--from", run, "--set", f"last={last}", "--out", soup, "-w", ws)
            steps = [str(int(i["step"].removeprefix("step-"))) for i in
                     json.loads((ws / soup / "manifest.json").read_text())["stats"]["inputs"]]
            loss = val_loss(ws, soup, None, soup)
            print(f"| {seed} | {', '.join(steps)} | {final:.4f} | {loss:.4f} | {loss - final:+.4f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="what")  # none: parity (what `make bench` runs)
    p = sub.add_parser("parity")
    p.add_argument("--scratch", type=Path)
    a = sub.add_parser("average")
    a.add_argument("workspace", type=Path)
    a.add_argument("--seeds", default="0,1")
    a.add_argument("--last", default="2,3")  # one average per value: the last K step folders
    a.add_argument("--save-every", type=int, default=25)
    a.add_argument("--set", action="append", default=[], dest="settings")  # more pretrain settings
    a.add_argument("--tag", default="")  # in the runs' names: pre<TAG>_s<SEED>
    args = ap.parse_args()
    if args.what in (None, "parity"):
        with tempfile.TemporaryDirectory() as tmp:
            parity(getattr(args, "scratch", None) or Path(tmp))
    else:
        average(args.workspace, [int(s) for s in args.seeds.split(",")], [int(k) for k in args.last.split(",")],
                args.save_every, args.settings, args.tag)


if __name__ == "__main__":
    main()
