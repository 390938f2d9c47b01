"""Training metrics: `metrics.jsonl` (one JSON object per logged step), TensorBoard event files,
a console line, and model-FLOPs utilisation (MFU).

MFU = model FLOPs per token (attention included) x tokens/s / peak FLOP/s of the devices used.
The peak comes from a table of dense bf16 tensor-core figures for known GPUs; on CPU it is the
fp32 matmul throughput of one thread (the best measured on this CPU so far), times the threads
used, so CPU MFU says how close the run gets to what this machine's BLAS can do.
"""

from __future__ import annotations

import functools
import json
import math
import sys
import time
from pathlib import Path

from llmkit.errors import UserError

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"

# Dense (no sparsity) bf16 peak per device, from the vendors' datasheets.
GPU_PEAK_FLOPS = {
    "GB200": 2.5e15,
    "B200": 2.25e15,
    "H200": 989e12,
    "H100": 989e12,  # SXM; the PCIe card is matched by "H100 PCIe" below
    "H100 PCIe": 756e12,
    "H800": 989e12,
    "GH200": 989e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "L40": 181e12,
    "L4": 121e12,
    "A10G": 70e12,
    "A10": 125e12,
    "A6000": 155e12,
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
    "V100": 125e12,  # fp16: V100 has no bf16
    "T4": 65e12,
    "MI300X": 1307e12,
    "MI250X": 383e12,
}


def gpu_peak_flops(device_name: str) -> float | None:
    """The table entry whose key is the longest substring of `device_name`, else None."""
    matches = [k for k in GPU_PEAK_FLOPS if k.lower() in device_name.lower()]
    return GPU_PEAK_FLOPS[max(matches, key=len)] if matches else None


def measured_cpu_peak_flops(size: int = 1024, repeats: int = 10) -> float:
    """fp32 matmul FLOP/s of one thread (measured once, ~0.3 s), times the threads torch uses now.

    One thread, because a measurement on all of them reads low whenever another process holds
    a core for that instant, and MFU then exceeds 100% once the core is free again. Even one
    thread reads low while a sibling hyperthread is busy, so the best rate ever measured on this
    CPU is remembered in the user's cache and used when higher.
    """
    import torch

    return torch.get_num_threads() * best_rate_seen(_one_thread_matmul_flops(size, repeats))


@functools.cache
def _one_thread_matmul_flops(size: int, repeats: int) -> float:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        torch.mm(a, b)  # warm the caches
        best = math.inf
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return 2 * size**3 / best


def best_rate_seen(rate: float) -> float:
    """max(rate, the best one-thread rate remembered for this CPU and torch), remembering it.
    The cache is `$XDG_CACHE_HOME/llmkit/cpu_peak_flops.json` (else ~/.cache/...); a cache that
    cannot be read or written only costs the memory."""
    import os
    import platform

    import torch

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llmkit" / \
        "cpu_peak_flops.json"
    key = f"{_cpu_name() or platform.machine()} | torch {torch.__version__}"
    try:
        seen = json.loads(cache.read_text())
    except (OSError, ValueError):
        seen = {}
    if not isinstance(seen, dict):
        seen = {}
    remembered = float(seen.get(key, 0.0))
    best = max(rate, remembered)
    if best > remembered:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({**seen, key: best}, indent=1))
            tmp.replace(cache)
        except OSError:
            pass
    return best


def _cpu_name() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def device_peak_flops(device: str) -> float:
    """Peak FLOP/s of one device: the GPU table, or a measured CPU matmul peak."""
    import torch

    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(device))
        peak = gpu_peak_flops(name)
        if peak is None:
            import warnings

            warnings.warn(f"no peak FLOP/s known for {name!r}; set peak_flops to get a true MFU "
                          "(using 312e12, an A100)")
            return 312e12
        return peak
    return measured_cpu_peak_flops()


def mfu(flops_per_token: float, tokens_per_s: float, peak_flops: float) -> float:
    return flops_per_token * tokens_per_s / peak_flops


def training_flops_per_token(model, all_trained: float | None) -> float:
    """Training FLOPs per token of `model` as it trains: `all_trained` (the task's figure for a
    model whose every weight trains: 6 per matmul weight, forward 2 and backward 4; None = 6 per
    parameter) less 2 per frozen matmul weight. A frozen weight (LoRA's base) still runs its
    forward and passes the gradient back to its input, but computes no gradient of its own."""
    if all_trained is None:
        all_trained = 6 * sum(p.numel() for p in model.parameters())
    return all_trained - 2 * frozen_matmul_weights(model)


def frozen_matmul_weights(model) -> float:
    """The frozen `nn.Linear` weights of `model`; a mixture-of-experts layer's experts (a module
    with `experts` and `top_k`) count for the share of tokens routed to each."""
    import torch

    share = {}
    for module in model.modules():
        experts, top_k = getattr(module, "experts", None), getattr(module, "top_k", None)
        if isinstance(experts, torch.nn.ModuleList) and top_k:
            share.update({id(m): top_k / len(experts) for m in experts.modules()})
    return sum(m.weight.numel() * share.get(id(m), 1.0) for m in model.modules()
               if isinstance(m, torch.nn.Linear) and not m.weight.requires_grad)


class MetricsLog:
    """Writes metrics.jsonl and TensorBoard events (rank 0 only; other ranks pass enabled=False).

    On resume the lines after the resumed step are dropped, so a resumed run's file equals an
    uninterrupted run's, and TensorBoard purges its later events the same way.
    """

    def __init__(self, run_dir: Path, enabled: bool = True, tensorboard: bool = True):
        self.path = Path(run_dir) / METRICS_FILE
        self.tb_dir = Path(run_dir) / TENSORBOARD_DIR
        self.enabled = enabled
        self.tensorboard = tensorboard
        self._writer = None
        self._purge_step: int | None = None

    def resume_at(self, step: int) -> None:
        """Keep only records of steps <= step (all of them are rewritten by the resumed run)."""
        self._purge_step = step + 1
        if not self.enabled or not self.path.exists():
            return
        kept = [line for line in self.path.read_text(encoding="utf-8").splitlines()
                if _step_of(line) is not None and _step_of(line) <= step]
        self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, allow_nan=True) + "\n")
        if self.tensorboard:
            writer = self._tensorboard()
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                    writer.add_scalar(_tb_tag(key), value, record["step"])
            writer.flush()

    def _tensorboard(self):
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.tb_dir), purge_step=self._purge_step)
        return self._writer

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of a run's metrics.jsonl ([] before its first step); a line that is not JSON
    is a UserError naming it."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line:
            try:
                rows.append(json.loads(line))
            except ValueError:
                raise UserError(f"{path}:{n} is not JSON") from None
    return rows


def _step_of(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None  # a line torn by a kill is dropped


def _tb_tag(key: str) -> str:
    return f"val/{key[4:]}" if key.startswith("val_") else f"train/{key}"


class ConsoleLine:
    """Where a run stands, on stderr. On a terminal: one live line (rich) redrawn at each logged
    step — a bar, step / max_steps, loss, tokens/s and the time left — with validation results
    kept above it. Elsewhere (CI, a pipe, a file): one plain line per logged step, as before.

    `max_steps` (the run's) gives the bar and the ETA; without it the live line shows the step
    alone. `clock` is injectable for tests."""

    def __init__(self, enabled: bool = True, max_steps: int | None = None, clock=time.monotonic,
                 stream=None):
        self.enabled = enabled
        self.max_steps = max_steps
        self.clock = clock
        self.stream = stream  # default: sys.stderr at the time of writing
        self._live = None
        self._first: tuple[int, float] | None = None  # (step, time) of the first line shown

    def show(self, record: dict) -> None:
        if not self.enabled:
            return
        stream = self.stream or sys.stderr
        if not stream.isatty():
            print(format_record(record), file=stream, flush=True)
            return
        now = self.clock()
        if self._first is None:
            self._first = (record["step"], now - record.get("step_s", 0.0))
        if self._live is None:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(console=Console(file=stream), auto_refresh=False, transient=False)
            self._live.start()
        self._live.update(self._renderable(record, now), refresh=True)
        if any(k.startswith("val_") for k in record):
            self._live.console.print(format_record(record), highlight=False)

    def eta_s(self, step: int, now: float) -> float | None:
        """Seconds left at the mean pace since the first line shown (resumed runs included)."""
        if self.max_steps is None or self._first is None:
            return None
        first_step, first_time = self._first
        done = step - first_step + 1
        if done <= 0 or now <= first_time:
            return None
        return (self.max_steps - step) * (now - first_time) / done

    def _renderable(self, record: dict, now: float):
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        text = live_text(record, self.max_steps, self.eta_s(record["step"], now))
        if self.max_steps is None:
            return text
        grid = Table.grid(padding=(0, 1))
        grid.add_row(ProgressBar(total=self.max_steps, completed=record["step"], width=24), text)
        return grid

    def note(self, message: str) -> None:
        if not self.enabled:
            return
        if self._live is not None:
            self._live.console.print(message, highlight=False)
        else:
            print(message, file=self.stream or sys.stderr, flush=True)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


def live_text(record: dict, max_steps: int | None, eta_s: float | None) -> str:
    """`step 120/1000 | loss 3.214 | 12,345 tok/s | ETA 4m12s` (the parts the record has)."""
    parts = [f"step {record['step']}" + (f"/{max_steps}" if max_steps else "")]
    if record.get("loss") is not None:
        parts.append(f"loss {record['loss']:.4g}")
    if record.get("tokens_per_s") is not None:
        parts.append(f"{record['tokens_per_s']:,.0f} tok/s")
    if eta_s is not None:
        parts.append(f"ETA {duration(eta_s)}")
    return " | ".join(parts)


def duration(seconds: float) -> str:
    """`45s`, `4m12s`, `2h05m`, `3d04h`."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


_SHOWN = ("loss", "val_loss", "val_ppl", "lr", "grad_norm", "tokens_per_s", "mfu", "skipped_steps")


def format_record(record: dict) -> str:
    parts = [f"step {record['step']}"]
    for key in _SHOWN + tuple(sorted(k for k in record if k not in _SHOWN and k not in _QUIET)):
        if key not in record or record[key] is None:
            continue
        value = record[key]
        if key == "tokens_per_s":
            parts.append(f"{value:,.0f} tok/s")
        elif key == "mfu":
            parts.append(f"mfu {100 * value:.1f}%")
        elif key == "lr":
            parts.append(f"lr {value:.2e}")
        elif isinstance(value, float):
            parts.append(f"{key} {value:.4g}")
        else:
            parts.append(f"{key} {value}")
    return " | ".join(parts)


_QUIET = {"step", "data_s", "step_s", "tokens_seen", "threads"}  # a change of threads is a note of its own
