"""Compressed files as streams decompressed a piece at a time, for a parser (fastwarc) that
reads them as files: memory stays at a chunk whatever a gzip member, a zstd frame or one
record inside them holds.

A stream never raises when its data breaks off: it ends early with `error` saying why (None
for a clean end), so the parser sees an ordinary end and its caller names the failure in one
row. `gzip_members` hands out a gzipped file's members one by one, so one corrupt member
costs only itself: after it, reading goes on at the next gzip magic.
"""

from __future__ import annotations

import io
import zlib
from pathlib import Path

GZIP_MAGIC = b"\x1f\x8b\x08"  # a gzip member's first bytes (deflate)
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # a zstd frame's first bytes
CHUNK = 1 << 16  # compressed bytes read at once (small: a member's leftover input is copied)


class Decompressed(io.RawIOBase):
    """Decompressed bytes, handed out as they are asked for; `pos` counts them, `error`
    says why they ended early."""

    def __init__(self):
        super().__init__()
        self.pos, self.error = 0, None

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def readinto(self, buf) -> int:
        data = self._next(len(buf)) if self.error is None else b""
        buf[:len(data)] = data
        self.pos += len(data)
        return len(data)

    def _next(self, n: int) -> bytes:
        """Up to `n` (at least 1) further bytes; b"" at the end, with `error` set if it
        came early."""
        raise NotImplementedError


class GzipMember(Decompressed):
    """One gzip member of the open file `f`, from `pending` (compressed bytes already read
    from `f`, the member's first) on; `offset` is where it starts in the file."""

    def __init__(self, f, pending: bytes, offset: int):
        super().__init__()
        self.f, self.pending, self.offset = f, pending, offset
        self._inflate = zlib.decompressobj(31)

    def _next(self, n: int) -> bytes:
        while not self._inflate.eof:
            if not self.pending:
                self.pending = self.f.read(CHUNK)
                if not self.pending:
                    self.error = "gzip member cut short"
                    return b""
            try:  # at most n out at a time: a page of one letter inflates a thousandfold
                out = self._inflate.decompress(self.pending, n)
            except zlib.error as e:
                self.error = f"gzip: {e}"
                return b""
            # after the member's end, what is left belongs to the next member
            self.pending = self._inflate.unused_data if self._inflate.eof else \
                self._inflate.unconsumed_tail
            if out:
                return out
        return b""

    def finish(self) -> None:
        """Inflate what the parser left of the member (a chunk at a time, thrown away), so
        that `pending` starts the next one."""
        while self.error is None and self._next(CHUNK):
            pass


def gzip_members(path: Path):
    """Each gzip member of the file as a `GzipMember` stream. Read one before asking for the
    next (what it leaves is inflated and dropped); after one that fails (`error`), the next
    is found by its magic bytes."""
    with open(path, "rb") as f:
        pending = f.read(CHUNK)
        while pending:
            member = GzipMember(f, pending, f.tell() - len(pending))
            yield member
            member.finish()
            if member.error is None:
                pending = member.pending or f.read(CHUNK)
            else:
                pending = _next_member(f, member.offset + 1)


def _next_member(f, pos: int) -> bytes:
    """The file from the first gzip magic at or after `pos` (b"" if none), a chunk of it."""
    f.seek(pos)
    while True:
        chunk = f.read(CHUNK)
        if len(chunk) < len(GZIP_MAGIC):
            return b""
        found = chunk.find(GZIP_MAGIC)
        if found >= 0:
            f.seek(pos + found)
            return f.read(CHUNK)
        pos += len(chunk) - len(GZIP_MAGIC) + 1
        f.seek(pos)


class ZstdStream(Decompressed):
    """A zstd file of one frame or several, its blocks handed out as they decode, so a file
    cut short keeps every block before the cut. (fastwarc's own zstd reader drops the blocks
    of its last read when that read meets the cut; python-zstandard's, used here, ends a cut
    file as if it were whole: `zstd_cut` tells.)"""

    def __init__(self, path: Path):
        import zstandard

        super().__init__()
        self.path, self._zstd, self._file = path, zstandard, open(path, "rb")
        self._reader = zstandard.ZstdDecompressor().stream_reader(self._file,
                                                                  read_across_frames=True)

    def _next(self, n: int) -> bytes:
        try:
            out = self._reader.read(n)
        except self._zstd.ZstdError as e:
            self.error = f"zstd: {e}"
            return b""
        if not out:
            self.error = zstd_cut(self.path)
        return out

    def close(self) -> None:
        self._file.close()
        super().close()


def zstd_cut(path: Path) -> str | None:
    """Why the zstd file's frames do not end where the file does, or None if they do: their
    headers and block headers walked (RFC 8878), the blocks skipped unread."""
    size = Path(path).stat().st_size
    pos = 0
    with open(path, "rb") as f:
        while pos < size:
            f.seek(pos)
            head = f.read(18)  # the longest frame header
            if len(head) >= 8 and int.from_bytes(head[:4], "little") >> 4 == 0x184D2A5:
                pos += 8 + int.from_bytes(head[4:8], "little")  # a skippable frame
                continue
            if head[:4] != ZSTD_MAGIC or len(head) < 5:
                return f"zstd: no frame at byte {pos}"
            flags = head[4]  # content size | single segment | checksum | dictionary id
            single = flags >> 5 & 1
            pos += 5 + (1 - single) + (0, 1, 2, 4)[flags & 3] + (single, 2, 4, 8)[flags >> 6]
            last = 0
            while not last:
                f.seek(pos)
                block = int.from_bytes(f.read(3), "little")
                last, kind, length = block & 1, block >> 1 & 3, block >> 3
                pos += 3 + (1 if kind == 1 else length)  # an RLE block stores its byte once
                if pos > size:
                    break
            pos += 4 * (flags >> 2 & 1)
    return None if pos == size else f"zstd: file cut short ({pos - size} bytes missing)"
