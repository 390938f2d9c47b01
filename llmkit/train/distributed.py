"""Process-group setup shared by every trainer: one process with no launcher, or many under
`torchrun` / `deepspeed` (which set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).

Without a launcher DeepSpeed would try MPI discovery and fail, so a lone process fills in a
world of one on a free local port. On CPU the backend is gloo and DeepSpeed's shared-memory
collective (a C++ extension JIT-compiled on first use, ~45 s) is switched off: gloo is enough
for the small CPU runs and nothing is compiled.
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import socket
from dataclasses import dataclass
from datetime import timedelta

from llmkit.errors import UserError

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
TIMEOUT_VAR = "LLMKIT_DIST_TIMEOUT"


@dataclass(frozen=True)
class DistEnv:
    rank: int  # this process's index among all processes
    world_size: int  # processes training together (data-parallel replicas)
    local_rank: int  # index on this machine: picks the GPU
    device: str  # "cuda:N" or "cpu"

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fill_single_process_env() -> bool:
    """Describe a world of one when no launcher did (True); a launcher's values are left alone."""
    if all(v in os.environ for v in LAUNCHER_VARS):
        return False
    if "RANK" in os.environ or "WORLD_SIZE" in os.environ:
        missing = [v for v in LAUNCHER_VARS if v not in os.environ]
        os.environ.setdefault("LOCAL_RANK", os.environ.get("RANK", "0"))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" in missing:
            os.environ["MASTER_PORT"] = str(free_port())
        return False
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()))
    return True


def setup_distributed() -> DistEnv:
    """Initialise torch.distributed through DeepSpeed (idempotent) and return this process's place."""
    import torch

    alone = fill_single_process_env()
    on_gpu = torch.cuda.is_available()
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if on_gpu else "cpu")
    import deepspeed
    import deepspeed.ops

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    local_rank = int(os.environ["LOCAL_RANK"])
    if on_gpu:
        torch.cuda.set_device(local_rank)
        backend, device = "nccl", f"cuda:{local_rank}"
    else:
        # build_shm_op() consults this table; marking the op unavailable skips its JIT build
        compatible = deepspeed.ops.__dict__.setdefault("__compatible_ops__", {})
        compatible["deepspeed_shm_comm"] = False
        backend, device = "gloo", "cpu"
    if not torch.distributed.is_initialized():
        if alone:  # a world of one keeps its store in memory: the TCP store looks 127.0.0.1 up by
            # DNS, a query off the machine that an offline run must not make; DeepSpeed adopts it
            torch.distributed.init_process_group(backend, store=torch.distributed.HashStore(), rank=0,
                                                 world_size=1, timeout=timedelta(seconds=collective_timeout_s()))
        deepspeed.init_distributed(dist_backend=backend, verbose=False,
                                   timeout=timedelta(seconds=collective_timeout_s()))
        # torn down before the interpreter's own exit: left to it, gloo's threads can race the
        # process's end and abort a finished run ("terminate called without an active exception")
        atexit.register(destroy_process_group)
    return DistEnv(torch.distributed.get_rank(), torch.distributed.get_world_size(), local_rank, device)


def destroy_process_group() -> None:
    import torch

    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def collective_timeout_s() -> float:
    """How long a process waits in a collective or barrier for the others (LLMKIT_DIST_TIMEOUT,
    seconds, default 1800): long enough for the main process's held-out generation or a
    checkpoint write, short enough that a dead rank stops the job within the hour."""
    value = os.environ.get(TIMEOUT_VAR, "1800")
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1
    if not seconds > 0:
        raise UserError(f"{TIMEOUT_VAR}={value!r}: give a number of seconds > 0")
    return seconds


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices): call before building a model so every rank
    builds the same initial weights."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def barrier() -> None:
    import torch

    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        torch.distributed.barrier()
