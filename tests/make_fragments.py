"""Dry-runs of the `stages/*.mk` fragments, as a pipeline Makefile would include them."""
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def make_env() -> dict:
    """This process's environment without an outer make's variables (under `make test` they
    would make an inner make print "Entering directory" lines into its output)."""
    return {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}


def make_dry_run(ws: Path, stage: str, *variables: str, check: bool = True) -> subprocess.CompletedProcess:
    """`make -n` for `<ws>/<stage>/manifest.json`; stdout holds the commands make would run."""
    return subprocess.run(
        ["make", "-n", "--no-print-directory", "-f", str(REPO / "stages/common.mk"),
         "-f", str(REPO / f"stages/{stage}.mk"), f"WS={ws}", *variables, f"{ws}/{stage}/manifest.json"],
        capture_output=True, text=True, check=check, env=make_env())


def make_command(ws: Path, stage: str, *variables: str) -> str:
    """The one command make would run, on one line."""
    out = make_dry_run(ws, stage, *variables).stdout
    return " ".join(out.replace("\\\n", " ").split())
