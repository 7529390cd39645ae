"""Where a session's output goes: the channel attached to it (`Sink`, attachment.py), and
the taps that see all of it whether a client is attached or not (`Tap`: a recording)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ...protocol.frames import FrameKind
from ...protocol.messages import AttachRole, Exit, Modes
from ..handover import RecordingState

# The exit of a session that ended with no status of its own for a client still attached.
LOST = Exit(code=-1, error="the server lost this session before it could learn its status")

class Sink(Protocol):
    """Where a session's output goes: the channel it is attached to (attachment.py)."""

    live: bool  # the replay (if any) is over: live output and the exit may go out
    grant: str | None  # the public id of the grant it came through (section 11), if any
    role: AttachRole  # WRITER, or the HTTP door's STREAM

    @property
    def peer(self) -> str:
        """Who is at the other end (for the journal)."""
        ...

    def limit(self) -> int:
        """Bytes that may be sent now (one frame at most); 0 until resumed."""
        ...

    def send_output(self, kind: FrameKind, data: bytes) -> bool:
        """Frame one output frame and hand it on; whether the sink takes more now."""
        ...

    @property
    def splices(self) -> bool:
        """Whether output may be spliced from a pipe into it (a live Unix socket's channel)."""
        ...

    def splice_output(self, kind: FrameKind, pipe: int, size: int) -> bool:
        """`send_output` of the next ``size`` bytes of ``pipe`` (they leave it either way)."""
        ...

    def modes(self, message: Modes) -> None:
        """The terminal's state changed (section 14): told if the channel asked."""
        ...

    def send_exit(self, status: Exit) -> bool:
        """Frame the channel's last frame; False when the channel had ended."""
        ...

    def stdin_consumed(self, size: int) -> None:
        """The process took ``size`` bytes of input later (STDIN credit may be granted)."""
        ...

    def audience(self, observers: int) -> None:
        """The number of observers changed (section 11)."""
        ...

    def lost(self) -> None:
        """The session is over without its exit: the channel ends all the same."""
        ...

    def release(self, reason: str | None = None) -> None:
        """The session goes on without this sink: the channel ends with `detached`."""
        ...


@runtime_checkable
class HandsOver(Protocol):
    """A tap that goes on after an upgrade in place (a recording)."""

    def handover(self, dry: bool = False) -> RecordingState | None: ...


class Tap(Protocol):
    """Sees every output chunk, input chunk and resize, and the end, whether a client is
    attached or not (a recording)."""

    def output(self, kind: FrameKind, data: bytes) -> None: ...

    def typed(self, data: bytes, hidden_run: int | None) -> None:
        """Input written to the process; ``hidden_run``: which run of input read unseen it
        belongs to (section 14), None when it is seen."""
        ...

    def resized(self, rows: int, cols: int) -> None: ...

    def exited(self, status: Exit) -> None: ...
