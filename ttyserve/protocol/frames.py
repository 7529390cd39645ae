"""Frame kinds, the 9-byte header, the encoder and the incremental decoder."""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from ..errors import RemoteProtocolError

HEADER = struct.Struct(">BII")
HEADER_SIZE = HEADER.size  # 9: kind u8, channel u32, length u32
DEFAULT_MAX_FRAME = 1 << 20  # 1 MiB: the contract's default payload limit


class FrameKind(enum.IntEnum):
    """The five frame kinds of protocol v1 (section 1)."""

    STDIN = 0
    STDOUT = 1
    STDERR = 2
    CTRL_IN = 3
    CTRL_OUT = 4


CLIENT_KINDS = frozenset({FrameKind.STDIN, FrameKind.CTRL_IN})
SERVER_KINDS = frozenset({FrameKind.STDOUT, FrameKind.STDERR, FrameKind.CTRL_OUT})


@dataclass(frozen=True, slots=True)
class Frame:
    """One decoded frame."""

    kind: FrameKind
    channel: int
    payload: bytes


def encode_frame(kind: FrameKind, channel: int, payload: bytes = b"") -> bytes:
    """Header and payload as one bytes object, so a frame is always written whole."""
    return HEADER.pack(kind, channel, len(payload)) + payload


class FrameDecoder:
    """Incremental decoder: feed any split of the byte stream, take whole frames out.

    The length field is checked against ``max_frame`` as soon as the header is
    complete, so a hostile length never makes the decoder allocate or wait for it.
    A malformed header stops decoding: the frames before it are returned and
    ``error`` is set, so a receiver acts on what came first, then fails.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self.error: RemoteProtocolError | None = None
        self._buffer = bytearray()
        self._offset = 0

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a frame."""
        return len(self._buffer) - self._offset

    def feed(self, data: bytes) -> list[Frame]:
        """Add received bytes; return every frame now complete, in order (none after an error)."""
        if self.error is not None:
            return []
        if self._offset:
            del self._buffer[: self._offset]
            self._offset = 0
        if self._buffer:
            self._buffer += data
            source: bytes | bytearray = self._buffer
        else:
            source = data  # the common case: parse the received bytes without copying them
        frames: list[Frame] = []
        offset = 0
        end = len(source)
        view = memoryview(source)
        try:
            while end - offset >= HEADER_SIZE:
                kind, channel, length = HEADER.unpack_from(source, offset)
                if kind > FrameKind.CTRL_OUT:
                    self.error = RemoteProtocolError(f"unknown frame kind {kind}")
                    break
                if length > self.max_frame:
                    self.error = RemoteProtocolError(
                        f"frame of {length} bytes exceeds max_frame {self.max_frame}")
                    break
                start = offset + HEADER_SIZE
                if end - start < length:
                    break
                frames.append(Frame(_KINDS[kind], channel, bytes(view[start : start + length])))
                offset = start + length
        finally:
            view.release()
        if self.error is not None:
            self._buffer.clear()
            self._offset = 0
        elif source is self._buffer:
            self._offset = offset
        elif offset < end:
            self._buffer += data[offset:]
        return frames

    def check(self) -> None:
        """Raise the error that stopped decoding, if any."""
        if self.error is not None:
            raise self.error


_KINDS = tuple(FrameKind)


class FrameQueue:
    """Frames decoded and not acted on yet, oldest first: a list and a cursor (an empty deque
    costs 600 bytes, and a connection holds one or two frames at a time)."""

    __slots__ = ("_frames", "_next")

    def __init__(self) -> None:
        self._frames: list[Frame] = []
        self._next = 0

    def __bool__(self) -> bool:
        return self._next < len(self._frames)

    def extend(self, frames: list[Frame]) -> None:
        """Queue ``frames`` (a list the queue may keep: `FrameDecoder.feed` makes a new one)."""
        if self._next < len(self._frames):
            self._frames.extend(frames)
        else:
            self._frames, self._next = frames, 0

    def popleft(self) -> Frame:
        """The oldest frame (the queue must not be empty)."""
        frame = self._frames[self._next]
        self._next += 1
        return frame

    def clear(self) -> None:
        self._frames, self._next = [], 0


class FrameTracker:
    """Follows where frames end in a byte stream, through their headers, keeping no payload.

    For a carriage that must cut the stream only between frames (section 8: a
    WebSocket message holds whole frames): what it sends, and what it receives.
    """

    def __init__(self) -> None:
        self._header = bytearray()
        self._left = 0  # payload bytes still to come in the current frame

    @property
    def at_boundary(self) -> bool:
        """Whether everything fed so far is whole frames."""
        return not self._header and not self._left

    def feed(self, data: bytes | bytearray | memoryview) -> int | None:
        """Follow ``data``: how many of its bytes end with the last frame completed in it,
        or None when no frame was completed in it."""
        view = memoryview(data)
        size = len(view)
        offset = 0
        last: int | None = None
        while offset < size:
            if self._left:
                step = min(self._left, size - offset)
                self._left -= step
                offset += step
            else:
                step = min(HEADER_SIZE - len(self._header), size - offset)
                self._header += view[offset:offset + step]
                offset += step
                if len(self._header) < HEADER_SIZE:
                    break
                self._left = HEADER.unpack(self._header)[2]
                self._header.clear()
            if not self._left and not self._header:
                last = offset
        return last
