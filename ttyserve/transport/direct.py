"""Output read in this process: a connection whose channels' output is handed to a reader
here instead of framed and sent (the HTTP API's output streams, which would otherwise
decode again what the server had just framed). The connection's core still counts every
byte against the channel's credit, and the reader grants it back as it passes the bytes
on, so flow control reaches the process as it does for any client; everything else on the
channel (`attached`, `exit`, `detached`) is framed as usual, after the output before it.
"""

from __future__ import annotations

from typing import Protocol

from ..protocol.frames import FrameKind
from ..protocol.messages import Modes, Offsets
from .streams import Buffer


class OutputReader(Protocol):
    """Takes a connection's channel output as it is delivered; never waits (the channel's
    credit bounds what it holds)."""

    def output(self, channel: int, kind: FrameKind, data: Buffer) -> None:
        """The channel's next output, in production order."""
        ...

    def skipped(self, channel: int, size: int, offsets: Offsets) -> None:
        """An observer's channel skipped ``size`` bytes: it goes on at ``offsets``."""
        ...

    def modes(self, channel: int, modes: Modes) -> None:
        """The terminal's state (section 14), in order with the output."""
        ...
