"""Code execution as a reward: a completion's code and its row's tests run in a sandboxed subprocess.

What is read: the completion's code is its first fenced ```python block (or its first fenced
block of any language; a fence left open runs to the end), else the whole text; a completion may also be a conversation (the last
message is read). The tests come from the row's `tests` column, else `test_list` (MBPP's), else
`test`: a string of Python (typically assert statements, any setup code between them) or a list
of such strings. The reward is the pass rate: a list scores the share of its items that run
without an exception; a string scores the share of its top-level `assert` statements that pass,
its other statements run in order as setup (one that raises fails every assert after it; a
string without asserts is one test). Every 0 has a reason: `syntax_error` (the code does not
compile), `failed` (an exception, a test that did not pass), `timeout` (wall or CPU time),
`memory`, `output` (stdout/stderr or a file beyond the size limit), `network`, `forbidden_write`,
`forbidden_read`, `process` (fork, exec, subprocess, ctypes), `crashed`, `no_tests`.

The sandbox (`SandboxLimits`), layer by layer:
- the code runs as a module named `solution` (its `if __name__ == "__main__":` block does not
  run), then the tests in the same namespace;
- a fresh `python -I -B` in a new session (process group), with a clean environment (PATH,
  HOME and TMPDIR in the scratch folder, one BLAS thread), stdin closed, cwd a scratch folder
  created for the run and removed afterwards whatever happened;
- rlimits set by the child on itself before the code runs: RLIMIT_CPU, RLIMIT_AS (memory),
  RLIMIT_FSIZE (every file written, stdout and stderr included, since they go to files),
  RLIMIT_NPROC (threads count), no core dumps;
- where the kernel allows it (this machine: yes, tested), new user and network namespaces
  (unshare): no interface but a loopback that is down, so no connection can leave the process
  (and in its own user namespace RLIMIT_NPROC counts the sandbox's processes only);
- an audit hook (PEP 578) installed before the code runs: a socket connect, bind, send or name
  lookup, an open for writing (or a rename, remove, mkdir, chmod, link) outside the scratch folder,
  an open or listing for reading outside the scratch folder, the interpreter's install and the
  system folders (/usr, /lib, /etc, /dev, its own /proc entry), fork/exec/subprocess/posix_spawn/os.system
  and ctypes end the run at once, scored 0 with the violation as its reason (so code that would
  catch the error cannot go on);
- the parent kills the whole process group at the wall limit and after every run. The kernel
  exempts root from RLIMIT_NPROC (even in a user namespace: the process is still uid 0 outside),
  so for a root caller this kill is the bound on processes beneath the audit hook.

What a determined attacker could still do: the harness shares the interpreter with the code.
Code written against this harness can read its globals (`import __main__`) and write a forged
report to the result pipe, scoring 1 without passing; a C extension already importable from
site-packages acts below the hook (ctypes is refused). With the hook so bypassed the limits that
remain are the kernel's: rlimits, the network namespace, the wall-time kill — files the caller's
user may write are then writable (the sandbox runs as that user: dropping to another needs an
interpreter that user can read, and /root/.pyenv here is not), and without namespaces the
network is open and root may fork until the wall-time kill; a process that leaves the process group
(setsid) outlives the kill. This stops accidents and the reward hacks a learning model stumbles
on; for adversarial code run the trainer in a container or VM.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from llmkit.errors import ConfigError

TEST_COLUMNS = ("tests", "test_list", "test")  # the first a row has holds its tests
# a fence left open (a reply cut at max_new_tokens) runs to the end of the text
_FENCED = re.compile(r"```[ \t]*(python|py|python3)?[^\n]*\n(.*?)(?:```|\Z)", re.S | re.I)


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 10.0  # the parent kills the process group after this
    cpu_s: int = 5  # RLIMIT_CPU
    memory_mb: int = 1024  # RLIMIT_AS: the address space, Python's own ~40 MB included
    file_mb: int = 8  # RLIMIT_FSIZE: any one file, stdout and stderr included
    processes: int = 8  # RLIMIT_NPROC (within the namespace where there is one)
    workers: int = 4  # samples run at once
    audit: bool = True  # the audit hook; off only to test the layers beneath it


@dataclass(frozen=True)
class Outcome:
    score: float  # the pass rate, 0 when anything was refused
    reason: str  # "passed", or why not: failed, timeout, memory, network, forbidden_write, ...
    passed: int = 0
    total: int = 0
    detail: str = ""  # the first error, shortened
    namespaces: bool = False  # whether the child ran in its own user and network namespaces


def extract_code(completion: Any) -> str:
    """The code of a completion: its first ```python block, else its first fenced block, else all."""
    text = completion if isinstance(completion, str) else (
        str(completion[-1].get("content") or "") if isinstance(completion, (list, tuple)) and completion
        and isinstance(completion[-1], dict) else str(completion))
    blocks = _FENCED.findall(text)
    python = [body for lang, body in blocks if lang]
    return (python or [body for _, body in blocks] or [text])[0]


def split_tests(tests: Any) -> list[tuple[str, bool]] | None:
    """The tests as (source, counts as a test) in the order they run — see the module docstring —
    or None for no tests: each item of a list counts; of a string with asserts, each top-level
    assert counts and the other statements are setup."""
    if tests is None:
        return None
    if not isinstance(tests, str):
        items = [(str(t), True) for t in tests if t is not None and str(t).strip()]
        return items or None
    if not tests.strip():
        return None
    try:
        body = ast.parse(tests).body
    except SyntaxError:
        return [(tests, True)]  # fails inside the sandbox, with its own error
    if not any(isinstance(node, ast.Assert) for node in body):
        return [(tests, True)]
    return [(ast.get_source_segment(tests, node) or ast.unparse(node), isinstance(node, ast.Assert))
            for node in body]


def run_in_sandbox(code: str, tests: Any, limits: SandboxLimits = SandboxLimits()) -> Outcome:
    """Run `code` then its `tests` in a sandbox (see the module docstring) and score them."""
    units = split_tests(tests)
    if units is None:
        return Outcome(0.0, "no_tests")
    scratch = Path(tempfile.mkdtemp(prefix="llmkit-sandbox-")).resolve()
    read_fd, write_fd = os.pipe()
    stdout, stderr = scratch / ".stdout", scratch / ".stderr"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(scratch), "TMPDIR": str(scratch), "LANG": "C.UTF-8",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    job = {"code": code, "tests": units, "scratch": str(scratch),
           "result_fd": write_fd, "limits": asdict(limits), "reads": _readable_roots()}
    try:
        with open(stdout, "wb") as out, open(stderr, "wb") as err:
            child = subprocess.Popen([sys.executable, "-I", "-B", "-c", _HARNESS, json.dumps(job)],
                                     stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=scratch,
                                     env=env, pass_fds=(write_fd,), start_new_session=True)
        os.close(write_fd)
        write_fd = -1
        try:
            child.wait(timeout=limits.wall_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill_group(child.pid)
        child.wait()
        report = _read_report(read_fd)
        tail = stderr.read_bytes()[-300:].decode(errors="replace") if stderr.exists() else ""
        return _outcome(report, child.returncode, timed_out, tail, sum(c for _, c in units))
    finally:
        for fd in (read_fd, write_fd):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(scratch, ignore_errors=True)


def code_outcomes(completions: Sequence[Any], tests: Sequence[Any],
                  limits: SandboxLimits = SandboxLimits()) -> list[Outcome]:
    """One Outcome per completion, run `limits.workers` at a time (threads that each wait on a
    child process: the work is in the children)."""
    if len(completions) != len(tests):
        raise ValueError(f"{len(completions)} completions but {len(tests)} rows of tests")
    with ThreadPoolExecutor(max_workers=max(1, limits.workers)) as pool:
        return list(pool.map(lambda pair: run_in_sandbox(extract_code(pair[0]), pair[1], limits),
                             zip(completions, tests)))


def code_reward(prompts: Sequence[Any], completions: Sequence[Any], *,
                limits: SandboxLimits | None = None, log_extra: Callable | None = None,
                log_metric: Callable | None = None, **columns: Sequence[Any]) -> list[float | None]:
    """The pass rate of each completion's code on its row's tests (TRL's reward signature);
    None for a row without tests. `limits` (functools.partial it in) defaults to SandboxLimits().
    `log_extra`/`log_metric` (what TRL's trainer passes) receive each sample's reason and the
    share of each reason in the batch."""
    name = next((c for c in TEST_COLUMNS if c in columns), None)
    if name is None:
        raise ConfigError(f"the code reward needs the tests in a column "
                          f"{' or '.join(map(repr, TEST_COLUMNS))}; the rows have "
                          f"{sorted(columns) or 'no other columns'}")
    outcomes = code_outcomes(completions, columns[name], limits or SandboxLimits())
    if log_extra is not None:
        log_extra("code_reason", [o.reason for o in outcomes])
    if log_metric is not None:
        for reason in sorted({o.reason for o in outcomes}):
            log_metric(f"code/{reason}", sum(o.reason == reason for o in outcomes) / len(outcomes))
    return [None if o.reason == "no_tests" else o.score for o in outcomes]


def _readable_roots() -> list[str]:
    """Where the sandboxed code may read: the interpreter's install (its stdlib and packages)."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    roots |= {p for p in sys.path if p and "site-packages" in p}
    return sorted(os.path.realpath(r) for r in roots)


def _kill_group(pid: int, wait_s: float = 5.0) -> None:
    """SIGKILL the child's process group, then wait (a while) until none of it is left: a fork
    bomb's processes may take a moment to die on a loaded machine."""
    deadline = time.monotonic() + wait_s
    try:
        os.killpg(pid, signal.SIGKILL)
        while time.monotonic() < deadline:
            time.sleep(0.02)
            os.killpg(pid, 0)
    except (ProcessLookupError, PermissionError):
        pass


def _read_report(fd: int) -> dict | None:
    os.set_blocking(fd, False)  # a grandchild holding the pipe open must not hang the caller
    chunks = []
    try:
        while len(chunk := os.read(fd, 65536)):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    try:
        return json.loads(b"".join(chunks).decode().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def _outcome(report: dict | None, returncode: int, timed_out: bool, stderr_tail: str,
             total: int) -> Outcome:
    namespaces = bool(report and report.get("namespaces"))
    if report and report.get("violation"):  # recorded by the hook even if the code went on
        return Outcome(0.0, report["violation"], 0, total, report.get("detail", ""), namespaces)
    if timed_out or returncode in (-signal.SIGXCPU, -signal.SIGKILL):  # wall limit, CPU limit
        return Outcome(0.0, "timeout", 0, total, f"exit {returncode}", namespaces)
    if report is None:
        return Outcome(0.0, "crashed", 0, total, f"exit {returncode}: {stderr_tail}")
    return Outcome(report["passed"] / total if total else 0.0, report["reason"],
                   report["passed"], total, report.get("detail", ""), namespaces)


# The child: limits, namespaces and the audit hook first, then the code and the tests. It is
# source text run by `python -c`, so it imports nothing of llmkit (which the hook would refuse).
_HARNESS = r'''
import ctypes, json, os, resource, sys, traceback
job = json.loads(sys.argv[1])
limits, scratch = job["limits"], job["scratch"]
result = os.fdopen(job["result_fd"], "w")
MB = 1 << 20
def unshare():
    try:  # a new user namespace makes the network namespace (and RLIMIT_NPROC) hold without root
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.unshare(0x10000000 | 0x40000000) == 0  # CLONE_NEWUSER | CLONE_NEWNET
    except Exception:
        return False
namespaces = unshare()
for name, value in (("RLIMIT_CPU", limits["cpu_s"]), ("RLIMIT_AS", limits["memory_mb"] * MB),
                    ("RLIMIT_FSIZE", limits["file_mb"] * MB), ("RLIMIT_NPROC", limits["processes"]),
                    ("RLIMIT_CORE", 0)):
    # CPU: SIGXCPU at the soft limit (reported as a timeout), SIGKILL a second later
    resource.setrlimit(getattr(resource, name), (value, value + (name == "RLIMIT_CPU")))
def refuse(reason, what):
    # the first violation ends the run: code that catches the error cannot go on to pass
    finish(0, total, reason, what.rstrip("/") or what, violation=True)
READS = tuple(os.path.join(r, "") for r in job["reads"] + ["/usr", "/lib", "/lib64", "/etc", "/dev",
                                                          "/proc/self", f"/proc/{os.getpid()}"])
INSIDE = os.path.join(scratch, "")
NETWORK = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
           "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo"}
PROCESS = {"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
           "subprocess.Popen", "ctypes.dlopen", "ctypes.dlsym", "ctypes.call_function", "os.kill", "os.killpg"}
CHANGES = {"os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link",
           "os.symlink", "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move"}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
def where(path, realpath=os.path.realpath, join=os.path.join, fsdecode=os.fsdecode, PathLike=os.PathLike):
    # bound at definition: code that replaces os.path.realpath must not steer the hook
    path = fsdecode(path) if isinstance(path, (str, bytes, PathLike)) else None
    return None if path is None else join(realpath(path), "")
def hook(event, args):
    if event in NETWORK:
        refuse("network", f"{event}{args[1:2]}")
    elif event in PROCESS:
        refuse("process", event)
    elif event == "open":
        path = where(args[0])
        if path is None or path.startswith(INSIDE) or path == "/dev/null/":
            return
        mode, flags = args[1], args[2]
        if (any(c in mode for c in "wax+") if isinstance(mode, str) else (flags or 0) & WRITE_FLAGS):
            refuse("forbidden_write", path)
        if not path.startswith(READS):
            refuse("forbidden_read", path)
    elif event in CHANGES:
        for arg in args[:2]:
            path = where(arg)
            if path is not None and not path.startswith(INSIDE):
                refuse("forbidden_write", path)
    elif event in ("os.listdir", "os.scandir"):
        path = where(args[0] if args[0] is not None else ".")
        if path is not None and not path.startswith(INSIDE) and not path.startswith(READS):
            refuse("forbidden_read", path)
def finish(passed, total, reason, detail="", violation=False):
    result.write(json.dumps({"passed": passed, "total": total, "reason": reason, "detail": detail[-300:],
                             "violation": reason if violation else None, "namespaces": namespaces}) + "\n")
    result.flush()
    os._exit(0)
def why(error):
    if isinstance(error, MemoryError):
        return "memory"
    if isinstance(error, OSError) and error.errno == 27:  # EFBIG: RLIMIT_FSIZE (Python ignores SIGXFSZ)
        return "output"
    if isinstance(error, OSError) and (error.errno in (101, 113) or type(error).__name__ == "gaierror"):
        return "network"  # ENETUNREACH, EHOSTUNREACH, no resolver: what the network namespace leaves
    return "failed"
def short(error):
    return "".join(traceback.format_exception_only(type(error), error)).strip()
total = sum(counts for _, counts in job["tests"])
try:
    program = compile(job["code"], "<completion>", "exec")
    units = [(compile(source, "<tests>", "exec"), counts) for source, counts in job["tests"]]
except (SyntaxError, ValueError, MemoryError) as error:  # ValueError: a NUL byte in the source
    finish(0, total, "syntax_error", short(error))
if limits["audit"]:
    sys.addaudithook(hook)
namespace = {"__name__": "solution"}  # not __main__: a main block reading stdin would fail every test
try:
    exec(program, namespace)
except BaseException as error:
    finish(0, total, why(error), short(error))
passed, first_error = 0, ""
for unit, counts in units:
    try:
        exec(unit, namespace)
        passed += counts
    except BaseException as error:
        if why(error) != "failed":
            finish(0, total, why(error), short(error))
        first_error = first_error or short(error)
        if not counts:  # setup that failed: the asserts after it cannot pass
            break
finish(passed, total, "passed" if passed == total else "failed", first_error)
'''
