"""Doubles for the server's middle layer with no event loop: a process whose output is a byte
string the test hands out, and a connection that records the frames its core makes.

The connection double is a real protocol core (`ServerConnection`) behind the attachments'
host interface, so what the tests read back is what a client would receive.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

from ttyserve.backends.base import ProcessSpec, Uncontained
from ttyserve.protocol.frames import Frame, FrameDecoder, FrameKind
from ttyserve.protocol.messages import (
    Attached,
    Exit,
    Hello,
    Offsets,
    Open,
    Opened,
    encode_message,
    parse_object,
)
from ttyserve.protocol.server import HelloReceived, OpenRequested, ServerConnection
from ttyserve.server.channels.attachment import Attachment
from ttyserve.server.channels.observer import Observer
from ttyserve.server.sessions.life import Event
from ttyserve.server.sessions.session import ServerSession
from ttyserve.transport.readiness import Watch
from ttyserve.transport.streams import Buffer


class FakeWatch:
    """A readiness watch the test fires by hand (`FakeSource.ready`), as the loop would."""

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.active = True

    def start(self) -> None:
        self.active = True

    def stop(self) -> None:
        self.active = False

    def close(self) -> None:
        self.active = False
        self.callback = lambda: None


class FakeSource:
    """An output stream whose bytes the test feeds in (`write`) and ends (`close`); with
    ``watchable`` its pump runs from readiness callbacks, which `ready` fires."""

    def __init__(self, watchable: bool = False) -> None:
        self.buffered = bytearray()
        self.closed = False
        self.watchable = watchable
        self.watcher: FakeWatch | None = None

    def ready(self) -> None:
        """The loop's readiness callback, if the pump watches the stream now."""
        if self.watcher is not None and self.watcher.active:
            self.watcher.callback()

    def write(self, data: bytes) -> None:
        self.buffered += data

    def close(self) -> None:
        self.closed = True

    @property
    def at_eof(self) -> bool:
        return self.closed and not self.buffered

    async def wait_readable(self) -> None:
        raise AssertionError("no waiting in a test with no event loop")

    def receive_nowait(self, limit: int) -> bytes:
        data = bytes(self.buffered[:limit])
        del self.buffered[:limit]
        return data

    def watch(self, callback: Callable[[], None]) -> Watch | None:
        if not self.watchable:
            return None  # the test steps the pump itself
        self.watcher = FakeWatch(callback)
        return self.watcher  # type: ignore[return-value]  # a Watch in all but its loop


class FakeProcess(Uncontained):
    """A `ProcessHandle` that runs nothing: the test says when it ends."""

    def __init__(self, pty: bool = False, pid: int = 4242, watchable: bool = False) -> None:
        self.pid = pid
        self.stdout = FakeSource(watchable)
        self.stderr: FakeSource | None = None if pty else FakeSource(watchable)
        self.status: Exit | None = None
        self.stdin = bytearray()
        self.signals: list[int] = []
        self.hung_up = 0
        self.stdin_closed = False  # `send_eof` was called
        self.size: tuple[int, int] | None = None  # the terminal's, once resized
        self.released = False  # its descriptors were let go (`release`, `aclose`)

    def write_nowait(self, data: bytes) -> int:
        self.stdin += data
        return len(data)

    async def send_stdin(self, data: bytes) -> None:
        self.stdin += data

    async def send_eof(self) -> None:
        self.stdin_closed = True

    def resize(self, rows: int, cols: int) -> None:
        self.size = (rows, cols)

    def send_signal(self, signum: int) -> None:
        self.signals.append(signum)

    def hang_up(self) -> bool:
        self.hung_up += 1
        return self.status is None

    def kill(self) -> None:
        self.signals.append(signal.SIGKILL)

    def watch_exit(self, reaped: Callable[[Exit], None]) -> Watch | None:
        return None  # the test says when it was reaped

    async def wait(self) -> Exit:
        raise AssertionError("no waiting in a test with no event loop")

    async def aclose(self) -> None:
        self.released = True

    def release(self) -> None:
        self.released = True


def make_session(*, pty: bool = False, detachable: bool = True, session_id: str = "s1",
                 owner: str = "uid:0", watchable: bool = False,
                 ) -> tuple[ServerSession, FakeProcess]:
    """A session on a fake process; its pumps are stepped by the test, or run from the
    readiness callbacks the test fires (``watchable``)."""
    process = FakeProcess(pty=pty, watchable=watchable)
    session = ServerSession(session_id, process, ProcessSpec(argv=["fake"], pty=pty), "test",
                            _no_tasks, owner=owner, scrollback=4096 if detachable else None)
    return session, process


def _no_tasks(work: object) -> None:
    raise AssertionError("no input pump in these tests: the fake process takes all input")


class Wire:
    """A connection as the attachments see it: a real protocol core, and what it framed."""

    def __init__(self, window: int | None = None, multiplex: bool = True) -> None:
        self.core = ServerConnection(output_frame=1024)
        self.core.receive_data(_hello(window, multiplex))
        event = self.core.next_event()
        assert isinstance(event, HelloReceived)
        self.core.accept_hello("test")
        self.room = True  # whether the connection's send queue has room
        self.ended: list[Attachment | Observer] = []
        self._decoder = FrameDecoder(1 << 30)
        self._channels = 0

    def open_channel(self, pty: bool = True) -> int:
        """A channel whose `open` (or `attach`) the core is waiting to have answered."""
        self._channels += 1
        channel = self._channels
        self.core.receive_data(_ctrl(channel, Open(argv=["fake"], pty=pty)))
        event = self.core.next_event()
        assert isinstance(event, OpenRequested)
        return channel

    def opened(self, session: ServerSession) -> Attachment:
        """`open` answered: an attachment of ``session`` on a new channel."""
        channel = self.open_channel(session.spec.pty)
        attachment = Attachment(self, channel, session)
        session.attach(attachment)
        assert self.core.opened(channel, Opened(pid=session.pid))
        return attachment

    def frames(self) -> list[Frame]:
        """What the core framed since the last call."""
        return self._decoder.feed(b"".join(bytes(b) for b in self.core.data_to_send()))

    # --- the attachments' host -----------------------------------------------------

    def output_limit(self, channel: int) -> int:
        return self.core.output_limit(channel) if self.room else 0

    def send_output(self, channel: int, kind: FrameKind, data: Buffer) -> None:
        self.core.send_output(channel, kind, bytes(data))

    send_output_soon = send_output  # (what the core framed is read by `frames`)

    peer = "test"
    splices = False  # (no socket: output is framed from what the pumps read)

    def frame_attached(self, attachment: Attachment | Observer, answer: Attached) -> None:
        self.core.attached(attachment.channel, answer)

    def send_skipped(self, channel: int, size: int, offsets: Offsets) -> None:
        self.core.send_skipped(channel, size, offsets)

    def send_audience(self, channel: int, observers: int) -> None:
        self.core.send_audience(channel, observers)

    def end_channel(self, attachment: Attachment | Observer, last: Exit | str | None) -> bool:
        self.ended.append(attachment)
        if isinstance(last, Exit):
            return self.core.send_exit(attachment.channel, last)
        return self.core.send_detached(attachment.channel, last)

    def stdin_consumed(self, channel: int, size: int) -> None:
        self.core.stdin_consumed(channel, size)


def controls(frames: list[Frame], channel: int) -> list[dict[str, object]]:
    return [parse_object(f.payload)[1] for f in frames
            if f.channel == channel and f.kind is FrameKind.CTRL_OUT]


def output(frames: list[Frame], channel: int) -> bytes:
    return b"".join(f.payload for f in frames
                    if f.channel == channel and f.kind in (FrameKind.STDOUT, FrameKind.STDERR))


def _ctrl(channel: int, message: Hello | Open) -> bytes:
    from ttyserve.protocol.frames import encode_frame

    return encode_frame(FrameKind.CTRL_IN, channel, encode_message(message))


def _hello(window: int | None, multiplex: bool) -> bytes:
    return _ctrl(0, Hello(protocol=1, multiplex=multiplex, window=window))


def exited(session: ServerSession, status: Exit, delivered: bool = False) -> None:
    """Bring ``session``'s life to its exit (reaped, output over, tree settled), as its
    drivers would; and past its delivery."""
    session.life.reaped(status)
    session.life.step(Event.OUTPUT_OVER)
    session.life.step(Event.SETTLED)
    if delivered:
        session.life.step(Event.DELIVERED)
