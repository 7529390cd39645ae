"""How the output of a connection's channels leaves it: framed by the connection's core
and sent through its send queue (`FramedOutput`, every client's), or handed to a reader in
this process (`DirectOutput`: the HTTP API's output streams, transport/direct.py). The
mode is chosen once, when the connection is made; the routes never know which it is.
"""

from __future__ import annotations

import asyncio
import time

import anyio

from ...defaults import SOON_BYTES
from ...protocol.frames import FrameKind
from ...protocol.messages import Modes, Offsets
from ...protocol.server import ServerConnection
from ...transport.direct import OutputReader
from ...transport.outbox import Outbox
from ...transport.splice import discard
from ...transport.streams import Buffer
from .peer_checks import PeerChecks


def flush(core: ServerConnection, outbox: Outbox, checks: PeerChecks) -> None:
    """Hand what ``core`` framed to the connection's writer, without waiting."""
    if core.pending and not outbox.broken:
        if (heartbeat := checks.heartbeat) is not None:
            heartbeat.last_sent = time.monotonic()
        try:
            outbox.push(core.data_to_send())
        except anyio.BrokenResourceError:
            pass  # the outbox has stopped the reader: the connection is going


class FramedOutput:
    """Output framed by the connection's core and handed to its send queue (the parts of
    the connection it needs, not the connection: nothing here keeps that alive)."""

    __slots__ = ("_checks", "_core", "_flush_soon", "_outbox", "_unflushed")

    def __init__(self, core: ServerConnection, outbox: Outbox, checks: PeerChecks) -> None:
        self._core, self._outbox, self._checks = core, outbox, checks
        self._unflushed = 0  # output framed by `send_soon` and not handed on yet
        self._flush_soon = False  # a flush at the end of this turn of the loop is due

    def limit(self, channel: int) -> int:
        return self._core.output_limit(channel) if self._outbox.has_room else 0

    def send(self, channel: int, kind: FrameKind, data: Buffer) -> None:
        if self._core.send_output(channel, kind, data):
            self._flush()

    def send_soon(self, channel: int, kind: FrameKind, data: Buffer) -> None:
        """Frame output that may go at the end of this turn of the loop: an observer's, so
        the frames of a chunk to every observer on this connection go in one send (never
        more than SOON_BYTES wait so, unseen by the send queue's bound)."""
        if not self._core.send_output(channel, kind, data):
            return
        self._unflushed += len(data)
        if self._unflushed >= SOON_BYTES:
            self._flush()
        elif not self._flush_soon:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # (not asyncio's loop: no callbacks to wait for)
                self._flush()
                return
            self._flush_soon = True
            loop.call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush_soon = False
        self._flush()

    def _flush(self) -> None:
        self._unflushed = 0
        flush(self._core, self._outbox, self._checks)

    def skipped(self, channel: int, size: int, offsets: Offsets) -> None:
        self._core.send_skipped(channel, size, offsets)

    def modes(self, channel: int, modes: Modes) -> None:
        """Framed behind the output framed before it (held or not), ahead of what follows."""
        self._core.send_modes(channel, modes)

    @property
    def splices(self) -> bool:
        return self._outbox.splices

    def splice(self, channel: int, kind: FrameKind, pipe: int, size: int) -> None:
        """Frame the next ``size`` bytes of ``pipe`` as output, moved by the kernel (what the
        socket does not take now, once it does: see the outbox); dropped if nothing can go."""
        core = self._core
        if not core.send_output_header(channel, kind, size):
            discard(pipe, size)
            return
        if (heartbeat := self._checks.heartbeat) is not None:
            heartbeat.last_sent = time.monotonic()
        self._unflushed = 0
        try:
            self._outbox.push_from_pipe(core.data_to_send(), pipe, size)
        except anyio.BrokenResourceError:
            pass  # the outbox has stopped the reader: the connection is going


class DirectOutput:
    """Output handed to ``reader`` in this process, its credit taken as if framed: the
    reader grants it back (a `window` on the connection) as it passes the bytes on."""

    __slots__ = ("_core", "_reader")
    splices = False

    def __init__(self, core: ServerConnection, reader: OutputReader) -> None:
        self._core = core
        self._reader = reader

    def limit(self, channel: int) -> int:
        return self._core.output_limit(channel)

    def send(self, channel: int, kind: FrameKind, data: Buffer) -> None:
        if self._core.spend_output(channel, kind, len(data)):
            self._reader.output(channel, kind, data)

    send_soon = send

    def skipped(self, channel: int, size: int, offsets: Offsets) -> None:
        self._reader.skipped(channel, size, offsets)

    def modes(self, channel: int, modes: Modes) -> None:
        if self._core.is_open(channel):
            self._reader.modes(channel, modes)

    def splice(self, channel: int, kind: FrameKind, pipe: int, size: int) -> None:
        raise AssertionError("output read in this process is never spliced")
