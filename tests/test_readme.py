"""Every command block of the README and of the docs pages runs, so an example cannot rot.

`sh` blocks are run line by line, in order — the README's, then each page of docs/ in name order,
whose commands build on what the README's built — in one scratch directory that holds a small copy
of `recipes/demo/data` (the commands name those files), with the sizes made tiny: step
counts and the vocabulary are scaled down and each training stage gets a tiny model and batch.
`console` blocks are `$ command` lines followed by the output they must print. `python` blocks are
executed after the commands, in the same directory. `make` lines are not run here: `make test` is
this suite and `make demo` is the 15-minute pipeline these commands cover in small.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmkit.cli.app import build_app
from llmkit.stages import STAGES
from llmkit.train.distributed import free_port

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
DEMO_DATA = "recipes/demo/data"
ROWS_PER_FILE = 120  # of each shipped data file in the scratch copy

# README value -> test value: 1,000 README steps are one test step
SCALED = {"max_steps": lambda n: max(2, n // 1000), "save_every": lambda n: max(1, n // 1000),
          "vocab_size": lambda n: 2000}
TINY_MODEL = ["model.hidden_size=32", "model.n_layers=2", "model.n_heads=2", "model.n_kv_heads=1",
              "model.intermediate_size=64", "model.max_seq_len=64"]
TRAIN = ["warmup_steps=0", "micro_batch_size=2", "eval_every=0", "seq_len=64"]
TINY = {
    "pretrain": TINY_MODEL + TRAIN + ["max_steps=2", "eval_batches=1"],
    "sft": TRAIN + ["max_steps=2", "eval_records=2", "max_new_tokens=4"],
    "rm": TRAIN + ["max_steps=2"],
    "dpo": TRAIN + ["max_steps=2", "eval_records=2", "max_new_tokens=4"],
    "kto": TRAIN + ["max_steps=2", "eval_records=2", "max_new_tokens=4"],
    "ppo": TRAIN + ["max_steps=2", "eval_records=2", "max_new_tokens=4"],
    "generate": ["max_new_tokens=4"],
    "eval": ["generation.max_new_tokens=4", "reward.max_new_tokens=4"],
}


def blocks(lang: str, pages: list[Path] = PAGES) -> list[str]:
    """The bodies of the `lang` fences of `pages`, in page order."""
    return [body for page in pages for fence, body in FENCE.findall(page.read_text()) if fence == lang]


def commands() -> list[str]:
    text = "\n".join(blocks("sh")).replace("\\\n", " ")  # join continued lines
    lines = [line.strip() for line in text.splitlines()]
    return [line for line in lines if line and not line.startswith(("#", "make "))]


def tiny(argv: list[str]) -> list[str]:
    """The README's command with test sizes: scaled `--set` values, then the stage's tiny settings
    (later `--set`s win). A pretrain command keeps its own max_steps, so extending a run stays
    an extension."""
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        out.append(f"{key}={SCALED[key](int(value))}" if sep and key in SCALED else arg)
    settings = [s for s in TINY.get(argv[1], []) if not (argv[1] == "pretrain" and
                                                         s.startswith("max_steps="))]
    return out + [a for s in settings for a in ("--set", s)]


def scratch_data(root: Path) -> None:
    """The first rows of every shipped demo file, under the same relative paths."""
    import gzip

    for src in (REPO / DEMO_DATA).rglob("*"):
        if not src.is_file():
            continue
        dst = root / src.relative_to(REPO)
        dst.parent.mkdir(parents=True, exist_ok=True)
        opener = gzip.open if src.suffix == ".gz" else open
        if ".jsonl" in src.suffixes:  # as bytes: the demo's broken file has invalid UTF-8 on purpose
            with opener(src, "rb") as f, opener(dst, "wb") as g:
                g.writelines(line for _, line in zip(range(ROWS_PER_FILE), f))
        else:
            shutil.copy(src, dst)


def run(line: str) -> str:
    """One README line: llmkit in this process; a launcher (`torchrun … $(which llmkit) …`) as a
    subprocess with the virtualenv's llmkit, its llmkit arguments made tiny the same way."""
    bin_dir = Path(sys.executable).parent
    llmkit = str(bin_dir / "llmkit")
    argv = shlex.split(line.replace("$(which llmkit)", llmkit), comments=True)
    if argv[0] == "llmkit":
        result = CliRunner().invoke(build_app(), tiny(argv)[1:])
        assert result.exit_code == 0, f"README: `{line}` exited {result.exit_code}:\n{result.output}"
        return result.output
    at = argv.index(llmkit)
    launcher, command = argv[:at], tiny(["llmkit", *argv[at + 1:]])
    # a port of its own: the launchers' default (29500) may still be held by an earlier test's run
    port = ["--master_port", str(free_port())]
    argv = [str(bin_dir / launcher[0]), *port, *launcher[1:], llmkit, *command[1:]]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"README: `{line}` exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A directory with the demo data's first rows, where every README command has run."""
    root = tmp_path_factory.mktemp("readme")
    scratch_data(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.delenv("LLMKIT_WORKSPACE", raising=False)
        outputs = {line: run(line) for line in commands()}
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()  # the local cluster `--executor ray` started here
    return root, outputs


def test_the_readme_and_the_docs_have_commands_to_run():
    assert blocks("sh", [README]) and blocks("console", [README]) and blocks("python", [README])
    assert len(commands()) >= 15 and blocks("sh", PAGES[1:])  # the docs pages' commands run too


def test_every_readme_command_runs(scratch):
    root, outputs = scratch
    assert list(outputs) == commands()
    extended = [out for line, out in outputs.items() if "continues from step" in line]
    assert extended and all("resumed from" in out for out in extended)
    status = outputs["llmkit status"]
    assert "incomplete" not in status and "stale" not in status


def test_every_readme_console_example_prints_what_it_shows(scratch, monkeypatch):
    monkeypatch.chdir(scratch[0])
    for block in blocks("console"):
        for example in block.split("$ ")[1:]:
            line, *shown = example.strip().splitlines()
            result = CliRunner().invoke(build_app(), shlex.split(line)[1:])
            for expected in shown:
                assert " ".join(expected.split()) in " ".join(result.output.split()), (line, result.output)


def test_every_readme_python_example_runs(scratch, monkeypatch):
    monkeypatch.chdir(scratch[0])
    for block in blocks("python"):
        exec(compile(block, "README.md", "exec"), {})


def test_the_architecture_map_names_the_package_as_it_is():
    """Every module and package of llmkit is named in docs/architecture.md's map, and nothing else is."""
    section = (REPO / "docs" / "architecture.md").read_text().split("## The map", 1)[1]
    tree = FENCE.search(section).group(2)
    package = REPO / "llmkit"
    named = set(re.findall(r"\b(\w+\.py|\w+/)", tree)) - {"llmkit/"}
    commands = {f"{s.command.replace('-', '_')}.py" for s in STAGES} | {"import_.py"}
    files = {p.name for p in package.rglob("*.py")} | {f"{p.name}/" for p in package.rglob("*")
                                                       if p.is_dir() and "__pycache__" not in p.parts}
    assert named <= files, named - files
    # cli/ holds one file per command ("one file per command" in the map names them)
    unnamed = {p.name for p in package.rglob("*.py") if p.parent.name != "cli" or p.name not in commands}
    unnamed |= {n for n in files if n.endswith("/")}
    assert unnamed - {"__init__.py"} <= named, sorted(unnamed - {"__init__.py"} - named)
