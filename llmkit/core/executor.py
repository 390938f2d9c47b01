"""Where a data stage's tasks run: in this machine's processes (`local`) or on Ray (`ray`).

Every data stage is split into deterministic tasks (an input file, a group of files, a MinHash
band…). A task writes its files in the stage's work area under temporary names and the driver
seals them with a marker (llmkit.data.driver.run_task), so it can run on any machine that sees
the workspace, be run again from scratch with the same result, and be skipped once sealed. The
executor only chooses where the pending tasks run (`RunsOn`, a data stage's `run` section);
the driver (the `llmkit` command) then assembles the artifact from the sealed task outputs,
the same way whichever executor ran them.

`ray` joins the cluster `ray.address` names (`auto` for the one `ray start --head` runs, or
`ray://HOST:10001`), else starts a private local one, never another cluster found on the machine
(`RAY_ADDRESS`, the last `ray start`). A task is a Ray task reserving
`ray.cpus_per_task` CPUs (and `ray.gpus_per_task` GPUs); Ray runs a task again when its worker
process dies (`ray.max_retries`). Every node must see the workspace at the same path, and a
task's working directory is not the driver's: the driver gives tasks absolute paths, and each
task first reads a token the driver wrote at the very path it uses, failing with a clear error
when it cannot.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

from llmkit.errors import ConfigError, UserError
from llmkit.core.progress import Progress
from llmkit.core.durable import kill_point

EXECUTORS = ("local", "ray")
RAY_INSTALL = "pip install 'llmkit[ray]'"
RAY_INIT = dict(include_dashboard=False, log_to_driver=False, logging_level="WARNING")
# A field with this metadata says where or how a stage runs, not what it computes: it is in
# config.yaml but not in the artifact's fingerprint (llmkit.core.workspace.Builder).
RUN_OPTION = {"fingerprint": False}


@dataclass
class RayConfig:
    address: str | None = None  # a running cluster: auto (`ray start --head` here), ray://HOST:10001; null: a private local one
    num_cpus: int | None = None  # CPUs of the private local cluster (address null); null: all
    cpus_per_task: float = 1.0  # CPUs Ray reserves for each task
    gpus_per_task: float = 0.0  # GPUs Ray reserves for each task (ppl-filter on GPUs: 1)
    max_retries: int = 3  # a task whose worker process died runs again, up to this many times

    def __post_init__(self):
        if self.cpus_per_task <= 0 or self.gpus_per_task < 0 or self.max_retries < 0:
            raise ConfigError("ray.cpus_per_task must be > 0, ray.gpus_per_task and "
                              "ray.max_retries ≥ 0")
        if self.num_cpus is not None and self.num_cpus < 1:
            raise ConfigError(f"ray.num_cpus must be ≥ 1 or null, got {self.num_cpus}")
        if self.num_cpus is not None and self.address:
            raise ConfigError(f"ray.num_cpus sizes the local cluster started without an address; "
                              f"the cluster at ray.address={self.address!r} has its own CPUs: "
                              "unset one of the two")


@dataclass
class RunsOn:
    """Where a data stage runs, the one home of it: a data stage's config holds it as its `run`
    section (recipe `run:`, `--set run.executor=ray`; `--executor`, `--workers`, `--rank` and
    `--world-size` are that section's flags). A section of the config rather than fields of the
    stage context, so that it resolves, is checked, printed (`llmkit config`) and recorded
    (config.yaml) as every other setting is, and one field's metadata keeps all of it out of the
    fingerprint: the same artifact wherever and on how many processes its tasks ran."""
    executor: Literal["local", "ray"] = "local"  # where tasks run: this machine's processes, or a Ray cluster
    workers: int = 1                 # local processes (a Ray task uses ray.cpus_per_task instead)
    rank: int | None = None          # run only the tasks t with t % world_size == rank, commit nothing
    world_size: int | None = None    # how many runs share the tasks (with rank: a Slurm array…)
    ray: RayConfig = field(default_factory=RayConfig)  # executor ray: the cluster, what a task reserves

    def __post_init__(self):
        if self.workers < 1:
            raise ConfigError(f"run.workers (--workers) must be ≥ 1, got {self.workers}")
        if (self.rank is None) != (self.world_size is None):
            raise ConfigError("run.rank and run.world_size (--rank, --world-size) go together")
        if self.rank is not None and not 0 <= self.rank < self.world_size:
            raise ConfigError(f"run.rank (--rank) must be in [0, {self.world_size}), got "
                              f"{self.rank}")

    def share(self, tasks: list[int]) -> list[int]:
        """The tasks this run owns: all, or with a rank those with t % world_size == rank."""
        if self.rank is None:
            return list(tasks)
        return [t for t in tasks if t % self.world_size == self.rank]

    def within_task(self) -> int:
        """Processes (or threads) one task may use: --workers here; on Ray, the CPUs a task
        reserves."""
        return self.workers if self.executor == "local" else max(1, int(self.ray.cpus_per_task))

    def run(self, fn: Callable, items: list, *, label: str, work_dir: Path,
            spread: bool) -> None:
        """`fn(item)` for each item on the executor; `spread`: locally on --workers processes
        side by side (else one at a time, each task using them itself)."""
        run_tasks(fn, items, label=label, executor=self.executor, ray=self.ray,
                  workers=self.workers if spread else 1, work_dir=work_dir)


def run_option():
    """A config field that says where or how a stage runs, not what it computes."""
    return field(default_factory=RunsOn, metadata=RUN_OPTION)


def run_tasks(fn: Callable, items: list, *, label: str, executor: str = "local",
              ray: RayConfig | None = None, workers: int = 1,
              work_dir: Path | None = None) -> None:
    """Run `fn(item)` for every item (each call one sealed, idempotent task) and wait for all.

    local: in this process, or on `workers` processes (the tasks' order of completion does not
    matter: each writes its own files). ray: one Ray task per item; `work_dir` is where the
    driver leaves the token that proves a worker sees the workspace."""
    if executor == "ray":
        require_ray()  # even with nothing to run: the setting is wrong here either way
    with Progress(label, total=len(items), unit="tasks") as bar:
        if executor == "ray":
            if items:
                _run_on_ray(fn, items, ray or RayConfig(), work_dir, bar)
        elif workers <= 1 or len(items) <= 1:
            for item in items:
                fn(item)
                bar.advance(1)
        else:
            from concurrent.futures import ProcessPoolExecutor

            n = min(workers, len(items))
            context = process_context()
            slots = context.Queue()
            for slot in range(n):
                slots.put(slot)
            with ProcessPoolExecutor(n, mp_context=context, initializer=_take_slot,
                                     initargs=(slots, n)) as pool:
                for _ in pool.map(fn, items):
                    bar.advance(1)


_slot: tuple[int, int] | None = None


def _take_slot(slots, n: int) -> None:
    global _slot
    _slot = (slots.get(), n)


def worker_slot() -> tuple[int, int] | None:
    """(this worker process's index, the pool's size) in a local pool of `run_tasks`, else
    None (this process, or a Ray task: Ray gives a task its own GPUs): a task that needs a
    device of its own takes device `index % devices`."""
    return _slot


def require_ray():
    """The `ray` module, or a UserError with the install line."""
    try:
        import ray
    except ImportError:
        raise UserError(f"--executor ray needs Ray, which is not installed: {RAY_INSTALL}") from None
    return ray


def _run_on_ray(fn, items, cfg: RayConfig, work_dir: Path | None, bar, check=None) -> None:
    ray = require_ray()
    connect(ray, cfg)
    if work_dir is not None:
        check = write_visibility_token(work_dir)
    task = ray.remote(_ray_task).options(num_cpus=cfg.cpus_per_task, num_gpus=cfg.gpus_per_task,
                                         max_retries=cfg.max_retries, retry_exceptions=False)
    fn_ref = ray.put(fn)  # shipped once, not with every task
    pending = [task.remote(fn_ref, item, check) for item in items]
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            _result(ray, done[0])
            bar.advance(1)
            kill_point("ray:task_done")
    except BaseException:
        for ref in pending:  # nothing keeps running for a run that stopped
            ray.cancel(ref, force=True)
        raise


def connect(ray, cfg: RayConfig) -> None:
    """Join the cluster `ray.address` names, else start a private local one: `ray.init()`
    without an address would join whatever `RAY_ADDRESS` or the machine's last `ray start`
    names, someone else's cluster perhaps. A process that already runs Ray keeps its own."""
    if ray.is_initialized():
        return
    try:
        if cfg.address:
            ray.init(address=cfg.address, **RAY_INIT)
        else:
            ray.init(address="local", num_cpus=cfg.num_cpus, **RAY_INIT)
    except (ConnectionError, ValueError, RuntimeError, TimeoutError) as e:
        raise UserError(_init_failed(cfg, e)) from None
    print(f"ray: {_where(ray, cfg)}", flush=True)


def _init_failed(cfg: RayConfig, e: Exception) -> str:
    reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
    if cfg.address:
        return (f"cannot join the Ray cluster at ray.address={cfg.address!r} ({reason}); start "
                "one (`ray start --head`), name a running one (HOST:6379, ray://HOST:10001), or "
                "unset ray.address for a private local cluster")
    return f"cannot start a local Ray cluster (ray.num_cpus={cfg.num_cpus}): {reason}"


def _where(ray, cfg: RayConfig) -> str:
    n = int(ray.cluster_resources().get("CPU", 0))
    cpus = f"{n} CPU{'s' * (n != 1)}"
    if not cfg.address:
        return f"a local cluster of {cpus}, for this run only"
    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    try:
        found = ray.get_runtime_context().gcs_address  # what `auto` found
    except Exception:  # a line of display never stops a run (a ray:// client may have none)
        found = cfg.address
    named = "" if found == cfg.address else f" (ray.address={cfg.address})"
    return f"the cluster at {found}{named}: {nodes} node{'s' * (nodes != 1)}, {cpus}"


def _result(ray, ref):
    """The task's result; a UserError raised in the task is raised here as itself (not as
    Ray's wrapper, whose message is the worker's traceback)."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, UserError):
            raise e.cause from None
        raise


VISIBILITY_FILE = "executor-token"


def write_visibility_token(work_dir: Path) -> tuple[str, str]:
    """Leave a fresh token in the work area; the tasks check they can read it (`see_workspace`)
    at `work_dir` as given, the path they write to (resolved, it would pass where theirs fails)."""
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(8)
    (work_dir / VISIBILITY_FILE).write_text(token)
    return str(work_dir), token


def see_workspace(check: tuple[str, str] | None) -> None:
    """Fail with a clear message where this process does not see the driver's workspace (a
    node's own disk at the same path holds no token, or another one)."""
    if check is None:
        return
    work_dir, token = check
    try:
        seen = (Path(work_dir) / VISIBILITY_FILE).read_text()
    except OSError:
        seen = None
    if seen != token:
        relative = ("" if Path(work_dir).is_absolute() else
                    f" (a relative path, here read from {os.getcwd()}: give the workspace as an "
                    "absolute path)")
        raise UserError(f"a Ray task on {socket.gethostname()} (pid {os.getpid()}) cannot see the "
                        f"workspace's work area {work_dir}{relative}: every node must mount the "
                        "workspace at the same path (NFS, Lustre, a shared volume); see the "
                        "README's 'Scaling out'")


def _ray_task(fn, item, check):
    see_workspace(check)
    return fn(item)


def process_context():
    """The multiprocessing context for worker processes: fork, but spawn once torch is
    loaded (forking a process that has started torch's thread pools can deadlock)."""
    import multiprocessing as mp
    import sys

    return mp.get_context("spawn" if "torch" in sys.modules else "fork")
