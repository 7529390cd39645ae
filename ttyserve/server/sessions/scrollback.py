"""The scrollback of a detachable session: its most recent output, in a bounded ring.

Output is kept in the order it was produced, as (stream, bytes) chunks, the
oldest dropped first once the ring is over its size. Each chunk also costs a
small fixed amount toward the size, so memory stays bounded however small the
chunks are; `dropped` counts only output bytes lost. Large chunks are kept in
pieces of at most one read (a read is kept whole, with no copy), and a partly
dropped head is a view, so trimming never copies much and never holds much
more than it counts.

The ring also keeps each stream's offsets (section 10): how many bytes the
stream has produced, and where the ring's oldest byte of it lies, so an attach
can begin at the offset a client names.
"""

from __future__ import annotations

import collections

from ...defaults import OUTPUT_CHUNK
from ...protocol.frames import FrameKind

CHUNK_COST = 64  # bytes a chunk counts beyond its data (the deque entry and the bytes object)
_COALESCE = 4096  # small chunks of one stream are joined into the last one, up to this
PIECE = OUTPUT_CHUNK  # large chunks are kept in pieces of at most one read


Chunk = tuple[FrameKind, bytes | bytearray | memoryview]


def add_chunk(chunks: collections.deque[Chunk], kind: FrameKind, data: bytes) -> int:
    """Append ``data`` as the ring keeps output (small writes of one stream joined into the
    last chunk, large ones in pieces of at most PIECE); the bytes it counts for (its data,
    and CHUNK_COST for each chunk it added). The ring and each observer's backlog count so.
    """
    last = chunks[-1] if chunks else None
    if (last is not None and last[0] is kind and len(last[1]) + len(data) <= _COALESCE
            and isinstance(last[1], bytearray)):
        last[1].extend(data)  # (a bytearray of its own: nothing else holds it)
        return len(data)
    if len(data) < _COALESCE:
        chunks.append((kind, bytearray(data)))  # small: more may be joined to it
        return len(data) + CHUNK_COST
    cost = 0
    for start in range(0, len(data), PIECE):  # a trimmed head (a view) never holds much more
        piece = data[start:start + PIECE]  # than it counts (a whole read: the same object)
        chunks.append((kind, piece))
        cost += len(piece) + CHUNK_COST
    return cost


class OffsetBeyondOutput(ValueError):
    """An attach named an offset its stream has not reached."""


class Scrollback:
    """A ring of output chunks at most ``size`` bytes (data plus CHUNK_COST per chunk)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.dropped = 0  # output bytes lost from the ring since the session started
        # Per stream: the offset of the ring's oldest byte, and of the next byte produced.
        self.start = {FrameKind.STDOUT: 0, FrameKind.STDERR: 0}
        self.end = {FrameKind.STDOUT: 0, FrameKind.STDERR: 0}
        self._chunks: collections.deque[Chunk] = collections.deque()
        self._used = 0

    @classmethod
    def restored(cls, size: int, dropped: int, start: dict[FrameKind, int],
                 end: dict[FrameKind, int], chunks: list[tuple[FrameKind, bytes]],
                 ) -> Scrollback:
        """A ring as another one was (`since(0, 0)` gave its chunks): an upgrade's."""
        ring = cls(size)
        for kind, data in chunks:
            ring.append(kind, data)
        ring.dropped, ring.start, ring.end = dropped, dict(start), dict(end)
        return ring

    def __len__(self) -> int:
        """Output bytes held."""
        return self._used - CHUNK_COST * len(self._chunks)

    def append(self, kind: FrameKind, data: bytes) -> None:
        """Keep ``data``; drop the oldest output beyond the size."""
        if not data:
            return
        self.end[kind] += len(data)
        self._used += add_chunk(self._chunks, kind, data)
        self._trim()

    def _trim(self) -> None:
        while self._used > self.size and self._chunks:
            kind, oldest = self._chunks[0]
            excess = self._used - self.size
            if excess >= len(oldest):
                self._chunks.popleft()
                self._used -= len(oldest) + CHUNK_COST
                self.dropped += len(oldest)
                self.start[kind] += len(oldest)
            else:  # only part of the oldest chunk must go (a view: no copy of the rest)
                self._chunks[0] = (kind, memoryview(oldest)[excess:])
                self._used -= excess
                self.dropped += excess
                self.start[kind] += excess

    def since(self, stdout: int = 0, stderr: int = 0,
              ) -> tuple[dict[FrameKind, int], list[tuple[FrameKind, bytes]]]:
        """What the ring holds from each stream's offset on, in production order (a copy),
        and the offset each stream's part begins at: the one asked for, or later where the
        ring no longer holds it. OffsetBeyondOutput for an offset not produced yet."""
        wanted = {FrameKind.STDOUT: stdout, FrameKind.STDERR: stderr}
        for kind, offset in wanted.items():
            if offset > self.end[kind]:
                raise OffsetBeyondOutput(
                    f"{kind.name.lower()} offset {offset} is beyond the {self.end[kind]} "
                    "bytes the stream has produced")
        begins = {kind: max(offset, self.start[kind]) for kind, offset in wanted.items()}
        position = dict(self.start)
        chunks = []
        for kind, data in self._chunks:
            at = position[kind]
            position[kind] = at + len(data)
            skip = begins[kind] - at
            if skip < len(data):
                chunks.append((kind, bytes(data[skip:]) if skip > 0 else bytes(data)))
        return begins, chunks
