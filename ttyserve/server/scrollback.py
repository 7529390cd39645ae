"""The scrollback of a detachable session: its most recent output, in a bounded ring.

Output is kept in the order it was produced, as (stream, bytes) chunks, the
oldest dropped first once the ring is over its size. Each chunk also costs a
small fixed amount toward the size, so memory stays bounded however small the
chunks are; `dropped` counts only output bytes lost. Large chunks are kept in
pieces of at most one read (a read is kept whole, with no copy), and a partly
dropped head is a view, so trimming never copies much and never holds much
more than it counts.
"""

from __future__ import annotations

import collections

from ..defaults import OUTPUT_CHUNK
from ..protocol.frames import FrameKind

CHUNK_COST = 64  # bytes a chunk counts beyond its data (the deque entry and the bytes object)
_COALESCE = 4096  # small chunks of one stream are joined into the last one, up to this
PIECE = OUTPUT_CHUNK  # large chunks are kept in pieces of at most one read


class Scrollback:
    """A ring of output chunks at most ``size`` bytes (data plus CHUNK_COST per chunk)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.dropped = 0  # output bytes lost from the ring since the session started
        self._chunks: collections.deque[tuple[FrameKind, bytes | bytearray | memoryview]] = (
            collections.deque())
        self._used = 0

    def __len__(self) -> int:
        """Output bytes held."""
        return self._used - CHUNK_COST * len(self._chunks)

    def append(self, kind: FrameKind, data: bytes) -> None:
        """Keep ``data``; drop the oldest output beyond the size."""
        if not data:
            return
        last = self._chunks[-1] if self._chunks else None
        if (last is not None and last[0] is kind and len(last[1]) + len(data) <= _COALESCE
                and isinstance(last[1], bytearray)):
            last[1].extend(data)
            self._used += len(data)
        elif len(data) < _COALESCE:
            self._chunks.append((kind, bytearray(data)))  # small: more may be joined to it
            self._used += len(data) + CHUNK_COST
        else:  # in pieces, so a trimmed head (a view) never holds much more than it counts
            for start in range(0, len(data), PIECE):
                piece = data[start:start + PIECE]
                self._chunks.append((kind, piece))
                self._used += len(piece) + CHUNK_COST
        self._trim()

    def _trim(self) -> None:
        while self._used > self.size and self._chunks:
            kind, oldest = self._chunks[0]
            excess = self._used - self.size
            if excess >= len(oldest):
                self._chunks.popleft()
                self._used -= len(oldest) + CHUNK_COST
                self.dropped += len(oldest)
            else:  # only part of the oldest chunk must go (a view: no copy of the rest)
                self._chunks[0] = (kind, memoryview(oldest)[excess:])
                self._used -= excess
                self.dropped += excess

    def snapshot(self) -> list[tuple[FrameKind, bytes]]:
        """What the ring holds now, oldest first (a copy: later output does not change it)."""
        return [(kind, bytes(data)) for kind, data in self._chunks]
