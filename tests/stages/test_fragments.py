"""A user's own Makefile that includes stages/*.mk: make orders the stages by their artifacts,
and `make -j` runs stages that do not depend on each other at the same time."""
import subprocess
import sys
import textwrap

from tests.make_fragments import REPO, make_env

# stands in for llmkit: logs (stage, start, end), waits, then writes the artifact's manifest
STUB = textwrap.dedent("""\
    import sys, time, pathlib
    args = sys.argv[1:]
    ws = pathlib.Path(args[args.index("-w") + 1])
    out = args[args.index("--out") + 1] if "--out" in args else args[0]
    start = time.time()
    time.sleep(1.0)
    (ws / out).mkdir(parents=True, exist_ok=True)
    (ws / out / "manifest.json").write_text("{}")
    with open(ws / "runs.log", "a") as f:
        f.write(f"{args[0]} {start} {time.time()}\\n")
""")


def test_a_users_makefile_runs_independent_stages_in_parallel(tmp_path):
    ws = tmp_path / "ws"
    for name in ("pretrain", "sft_train", "pref_train"):
        (ws / name).mkdir(parents=True)
        (ws / name / "manifest.json").write_text("{}")
    (tmp_path / "stub.py").write_text(STUB)
    (tmp_path / "Makefile").write_text(textwrap.dedent(f"""\
        LLMKIT := {sys.executable} {tmp_path / "stub.py"}
        WS := {ws}
        all: $(WS)/rm/manifest.json $(WS)/dpo/manifest.json
        include {REPO}/stages/common.mk
        include {REPO}/stages/sft.mk {REPO}/stages/rm.mk {REPO}/stages/dpo.mk
        """))
    env = make_env()
    subprocess.run(["make", "-j2", "--no-print-directory", "-C", str(tmp_path)], check=True, env=env,
                   capture_output=True, text=True)
    runs = {stage: (float(a), float(b)) for stage, a, b in
            (line.split() for line in (ws / "runs.log").read_text().splitlines())}
    assert set(runs) == {"sft", "rm", "dpo"}
    assert runs["sft"][1] <= min(runs["rm"][0], runs["dpo"][0])  # both wait for sft ...
    assert runs["rm"][0] < runs["dpo"][1] and runs["dpo"][0] < runs["rm"][1]  # ... then overlap
    again = subprocess.run(["make", "-j2", "--no-print-directory", "-C", str(tmp_path)], env=env,
                           capture_output=True, text=True)
    assert "Nothing to be done" in again.stdout and len((ws / "runs.log").read_text().splitlines()) == 3
