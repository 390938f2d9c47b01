"""Weights on 2 MB pages for the decoding kernels (`llmkit.model.cpu_kernels`' panels).

A decoding step streams every packed weight once. On 4 KB pages SmolLM2's 270 MB of bf16 weights
cross 69,000 page boundaries, each a TLB miss and a restart of the hardware prefetcher; on 2 MB
pages (Linux's transparent huge pages, asked for with madvise where the kernel's mode is
`madvise`) its batch-1 step at one thread went from 56.9 to 68.8 tokens/s (bf16), 97.1 to 106.3
(int8) (bench/results/2026-12-07-decode-step.md). LLMKIT_HUGE_PAGES=0 keeps torch's allocation.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20


class PanelArena:
    """Panels cut from chunks of CHUNK bytes on 2 MB pages: SmolLM2's matrices are 0.7-3.5 MB but for
    the vocabulary's, too small for pages of their own. A chunk lives while a slice of it does (the
    current one stays with the process); a weight of more than half a chunk has a region of its own."""

    CHUNK = 32 << 20

    def __init__(self):
        self.chunk, self.used = None, 0

    def take(self, size: int) -> torch.Tensor:
        """`size` bytes (uint8) starting on a 64-byte boundary."""
        if size > self.CHUNK // 2:  # a region of its own, freed with its weight
            return self._huge_pages(size)[:size]
        if self.chunk is None or self.used + size > len(self.chunk):
            self.chunk, self.used = self._huge_pages(max(self.CHUNK, size)), 0
        out = self.chunk[self.used:self.used + size]
        self.used += -(-size // 64) * 64
        return out

    @staticmethod
    def _huge_pages(size: int) -> torch.Tensor:
        size = -(-size // HUGE_PAGE) * HUGE_PAGE
        raw = torch.empty(size + HUGE_PAGE, dtype=torch.uint8)  # untouched: no page is faulted in yet
        start = -raw.data_ptr() % HUGE_PAGE
        _madvise_huge_pages()(ctypes.c_void_p(raw.data_ptr() + start), ctypes.c_size_t(size), 14)  # MADV_HUGEPAGE
        return raw[start:start + size]


_ARENA = PanelArena()


def panel_storage(n: int, dtype: torch.dtype) -> torch.Tensor:
    """An empty tensor of n values for a weight's panels: from the huge-page arena where there is
    one, else as torch allocates."""
    size = n * torch.empty(0, dtype=dtype).element_size()
    if size < (64 << 10) or not _madvise_huge_pages():
        return torch.empty(n, dtype=dtype)
    return _ARENA.take(size).view(dtype)


@functools.cache
def _madvise_huge_pages():
    """libc's madvise (MADV_HUGEPAGE = 14) where it is Linux's and huge pages are not off; else None."""
    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    if "[never]" in mode or os.environ.get("LLMKIT_HUGE_PAGES") == "0":
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes, libc.madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return libc.madvise
