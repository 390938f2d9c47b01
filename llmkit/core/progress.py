"""Progress bars with rows/s on a terminal, sparse plain lines otherwise; end-of-stage summary."""

from __future__ import annotations

import sys
import time
from typing import Sequence

from llmkit.core.durable import kill_point


def is_tty() -> bool:
    return sys.stdout.isatty()


class Progress:
    """`with Progress("clean", total=n) as p: p.advance(rows)`."""

    def __init__(self, label: str, total: int | None = None, unit: str = "rows"):
        self.label, self.total, self.unit = label, total, unit
        self.done = 0
        self._start = time.time()
        self._last_line = self._start
        self._rich = None

    def __enter__(self):
        if is_tty():
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress,
                                       TextColumn, TimeElapsedColumn)

            self._rich = RichProgress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), transient=True)
            self._rich.start()
            self._task = self._rich.add_task(self.label, total=self.total, rate="")
        return self

    def advance(self, n: int) -> None:
        kill_point("progress")
        self.done += n
        now = time.time()
        rate = self.done / max(now - self._start, 1e-9)
        if self._rich is not None:
            self._rich.update(self._task, advance=n, rate=f"{rate:,.0f} {self.unit}/s")
        elif now - self._last_line > 10:
            self._last_line = now
            total = f"/{self.total:,}" if self.total else ""
            print(f"{self.label}: {self.done:,}{total} {self.unit} ({rate:,.0f}/s)", flush=True)

    def __exit__(self, *exc):
        if self._rich is not None:
            self._rich.stop()


def print_summary(title: str, rows: list[tuple[str, object]]) -> None:
    """One screen: key/value lines (rich table on a terminal)."""
    if is_tty():
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title, show_header=False, title_justify="left")
        for k, v in rows:
            t.add_row(k, _fmt(v))
        Console().print(t)
    else:
        print(title)
        for k, v in rows:
            print(f"  {k:<24} {_fmt(v)}")


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.3f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def data_stage_summary(name: str, stats: dict, seconds: float,
                       notes: Sequence[tuple[str, object]] = ()) -> None:
    """Rows in, out and removed (the top reasons), then a stage's own `notes` lines."""
    rows = [("rows in", stats["rows_in"]), ("rows out", stats["rows_out"]),
            ("rows removed", stats["rows_removed"])]
    top = sorted(stats.get("removed_by_reason", {}).items(), key=lambda kv: -kv[1])[:8]
    rows += [(f"  {reason}", n) for reason, n in top]
    rows += list(notes)
    rows.append(("seconds", round(seconds, 2)))
    print_summary(f"{name} done", rows)
