"""The client's end of protocol v1, without I/O: the mirror of `server.py`.

Requests are framed here (and refused with LocalProtocolError when the
protocol forbids them: an id used twice, STDIN beyond the server's window);
received frames are checked against every rule a server must keep, so a
server that sends after `exit` or overdraws a channel's credit is a
RemoteProtocolError at once.
"""

from __future__ import annotations

import collections

import msgspec

from ..errors import ErrorCode, LocalProtocolError, RemoteProtocolError, RequestError
from .channels import Channel, ChannelState, ChannelTable, Credit, Step, next_state
from .frames import (
    DEFAULT_MAX_FRAME,
    SERVER_KINDS,
    FrameDecoder,
    FrameKind,
    FrameQueue,
    encode_frame,
)
from .messages import (
    SERVER_MESSAGES,
    Attach,
    Attached,
    Audience,
    Cancel,
    Detached,
    Error,
    Exit,
    Hello,
    List,
    ListTargets,
    Message,
    Modes,
    Open,
    Opened,
    Ping,
    Pong,
    Release,
    Sessions,
    Share,
    Shared,
    Skipped,
    Targets,
    Unshare,
    Unshared,
    Welcome,
    Window,
    convert_message,
    encode_message,
    parse_object,
)

RECENT_ENDS = 1024  # channels the server ended that we remember, to catch a frame after the end
# Codes of an `error` on channel 0 that refuse one request there (`share`, `unshare`, `list`
# on a grant's connection) while the connection goes on; any other ends the connection.
REQUEST_REFUSALS = frozenset({ErrorCode.BAD_REQUEST, ErrorCode.FORBIDDEN,
                              ErrorCode.NO_SUCH_SESSION, ErrorCode.UNKNOWN_MESSAGE})


class WelcomeReceived(msgspec.Struct, frozen=True):
    welcome: Welcome


class OpenedReceived(msgspec.Struct, frozen=True):
    channel: int
    opened: Opened


class AttachedReceived(msgspec.Struct, frozen=True):
    channel: int
    attached: Attached


class DetachedReceived(msgspec.Struct, frozen=True):
    """The channel's last frame: its session goes on without it (``reason`` "stolen"...)."""

    channel: int
    reason: str | None


class SessionsReceived(msgspec.Struct, frozen=True):
    sessions: Sessions


class AnswerReceived(msgspec.Struct, frozen=True):
    """The answer to a request on channel 0 (`shared`, `unshared`, `targets`), or its
    refusal."""

    answer: Shared | Unshared | Targets | Error


class NoticeReceived(msgspec.Struct, frozen=True):
    """News on a live channel: section 11's `skipped` (an observer fell behind) or
    `audience` (to the writer: how many watch), section 14's `modes`."""

    channel: int
    notice: Skipped | Audience | Modes


class OpenRefused(msgspec.Struct, frozen=True):
    """The `open` on ``channel`` was answered with `error`; the channel has ended."""

    channel: int
    error: Error


class OutputReceived(msgspec.Struct, frozen=True):
    channel: int
    kind: FrameKind  # STDOUT or STDERR
    data: bytes


class ExitReceived(msgspec.Struct, frozen=True):
    channel: int
    exit: Exit


class ErrorReceived(msgspec.Struct, frozen=True):
    """An `error` on channel 0 (the connection) or refusing a control message on N."""

    channel: int
    error: Error


class PingReceived(msgspec.Struct, frozen=True):
    """The server's heartbeat: answer with `pong()` at once (section 10)."""


class StdinCreditGranted(msgspec.Struct, frozen=True):
    """The server granted ``bytes`` more STDIN credit on ``channel``."""

    channel: int
    bytes: int = 0


ClientEvent = (
    WelcomeReceived | OpenedReceived | AttachedReceived | OpenRefused | OutputReceived
    | ExitReceived | DetachedReceived | ErrorReceived | StdinCreditGranted | SessionsReceived
    | PingReceived | AnswerReceived | NoticeReceived
)


class ClientConnection:
    """One connection as the client sees it."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self._decoder = FrameDecoder(max_frame)
        self.channels = ChannelTable()
        self.hello_sent: Hello | None = None
        self.welcome: Welcome | None = None
        self._ended_by_server: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._frames = FrameQueue()
        self.error: RemoteProtocolError | None = None  # the server broke the protocol

    # --- requests ---------------------------------------------------------------

    def hello(self, hello: Hello) -> bytes:
        if self.hello_sent is not None:
            raise LocalProtocolError("'hello' was already sent")
        self.hello_sent = hello
        return _control_frame(0, hello)

    def open(self, channel: int, request: Open | Attach) -> bytes:
        """Frame an `open` (or an `attach`); the channel is opening until its answer."""
        if self.hello_sent is None:
            raise LocalProtocolError("'open' before 'hello'")
        if channel < 1 or self.channels.state(channel) is not None:
            raise LocalProtocolError(f"channel {channel} cannot be opened (0, or used before)")
        if not self.hello_sent.multiplex and len(self.channels.used):
            raise LocalProtocolError("this connection carries one session (multiplex is false)")
        self.channels.begin(channel, not isinstance(request, Open) or request.pty,
                            self.hello_sent.window, self._stdin_window())
        return _control_frame(channel, request)

    def list_sessions(self) -> bytes:
        """Frame `list` (channel 0); the answer is a SessionsReceived event."""
        return self._channel_0(List())

    def list_targets(self) -> bytes:
        """Frame `targets` (channel 0); the answer is an AnswerReceived event."""
        return self._channel_0(ListTargets())

    def share(self, request: Share) -> bytes:
        """Frame `share` (channel 0); the answer is an AnswerReceived event."""
        return self._channel_0(request)

    def unshare(self, request: Unshare) -> bytes:
        """Frame `unshare` (channel 0); the answer is an AnswerReceived event."""
        return self._channel_0(request)

    def _channel_0(self, request: Message) -> bytes:
        if self.hello_sent is None:
            raise LocalProtocolError(f"'{type(request).__name__.lower()}' before 'hello'")
        return _control_frame(0, request)

    def release(self, session: str) -> bytes:
        """Frame `release` (channel 0): an ended session's exit was read, forget it."""
        return _control_frame(0, Release(session=session))

    def ping(self) -> bytes:
        """Frame `ping` (channel 0): the heartbeat, when nothing else was sent a while."""
        return _control_frame(0, Ping())

    def pong(self) -> bytes:
        """Frame `pong` (channel 0), the answer to the server's `ping`."""
        return _control_frame(0, Pong())

    def _stdin_window(self) -> int:
        """The STDIN credit a channel starts with: 0 until `welcome` says it."""
        return (self.welcome.window or 0) if self.welcome is not None else 0

    def live(self, channel: int) -> bool:
        """Whether ``channel`` is opening or open (it has not ended on either side)."""
        return channel in self.channels.live

    def opening(self, channel: int) -> bool:
        """Whether ``channel``'s `open` (or `attach`) still waits for its answer."""
        return self.channels.state(channel) is ChannelState.OPENING

    @property
    def max_frame(self) -> int:
        """The largest payload the server takes (what `welcome` said; the default until
        then)."""
        return self.welcome.max_frame if self.welcome is not None else DEFAULT_MAX_FRAME

    def stdin_credit(self, channel: int) -> int | None:
        """STDIN the channel may send now: None for no limit, 0 to wait for a grant."""
        record = self.channels.live.get(channel)
        if record is None:
            return 0
        return None if record.stdin is None else record.stdin.available

    def stdin_limit(self, channel: int) -> int:
        """The most the next STDIN frame of ``channel`` may carry: its credit, within the
        server's `max_frame`; 0 to wait for a grant (or once the channel has ended)."""
        credit = self.stdin_credit(channel)
        return self.max_frame if credit is None else min(credit, self.max_frame)

    def stdin(self, channel: int, data: bytes) -> bytes:
        """Frame STDIN; LocalProtocolError beyond the channel's credit."""
        record = self.channels.live.get(channel)
        if record is None:
            raise LocalProtocolError(f"channel {channel} is not live")
        if record.stdin is not None and not record.stdin.spend(len(data)):
            raise LocalProtocolError(f"channel {channel}: {len(data)} bytes of STDIN exceed "
                                     f"its credit of {record.stdin.available}")
        return encode_frame(FrameKind.STDIN, channel, data)

    def control(self, channel: int, message: Message) -> bytes:
        """Frame `resize`, `signal`, `eof` or `window` (which adds output credit)."""
        if isinstance(message, Cancel):
            return self.cancel(channel)
        record = self.channels.live.get(channel)
        if record is None:
            raise LocalProtocolError(f"channel {channel} is not live")
        if isinstance(message, Window) and record.output is not None:
            record.output.add(message.bytes)
        return _control_frame(channel, message)

    def output_consumed(self, channel: int, size: int) -> bytes:
        """The application took ``size`` bytes of the channel's output: a `window` frame
        granting them back once half the window was taken, else b"" (section 7)."""
        record = self.channels.live.get(channel)
        if record is None or record.output is None:
            return b""
        grant = record.output.consumed(size)
        return _control_frame(channel, Window(bytes=grant)) if grant else b""

    def cancel(self, channel: int) -> bytes:
        """Frame `cancel`: the channel ends here; what the server sent meanwhile is dropped."""
        if not self.channels.step(channel, Step.CANCELLED):
            return b""
        return _control_frame(channel, Cancel())

    # --- what the server sends ------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Feed received bytes; take the events out with `next_event`."""
        if self.error is None:
            self._frames.extend(self._decoder.feed(data))

    def next_event(self) -> ClientEvent | None:
        """The next event, or None until more data comes; unknown message types are skipped.

        Raises RemoteProtocolError at the first frame that breaks the protocol (the
        events before it were handed out), and again on every later call.
        """
        if self.error is not None:
            raise self.error
        try:
            while self._frames:
                frame = self._frames.popleft()
                if frame.kind not in SERVER_KINDS:
                    raise RemoteProtocolError(
                        f"frame kind {frame.kind.name} is not sent by servers")
                if self.welcome is None and frame.channel != 0:
                    raise RemoteProtocolError(f"channel {frame.channel} before 'welcome'")
                if frame.kind is FrameKind.CTRL_OUT:
                    event = self._control(frame.channel, frame.payload)
                else:
                    event = self._output(frame.channel, frame.kind, frame.payload)
                if event is not None:
                    return event
            self._decoder.check()
        except RemoteProtocolError as exc:
            self.error = exc
            self._frames.clear()
            raise
        return None

    def _live(self, channel: int, what: str) -> Channel | None:
        """The channel's record; None when it ended on our side (the frame is dropped)."""
        record = self.channels.live.get(channel)
        if record is not None:
            return record
        if channel in self._ended_by_server:
            raise RemoteProtocolError(f"{what} on channel {channel} after its last frame")
        if channel not in self.channels.used:
            raise RemoteProtocolError(f"{what} on channel {channel}, which was never opened")
        return None  # cancelled here, or ended long ago

    def _output(self, channel: int, kind: FrameKind, payload: bytes) -> OutputReceived | None:
        record = self._live(channel, kind.name)
        if record is None:
            return None
        if record.state is not ChannelState.OPEN:
            raise RemoteProtocolError(f"{kind.name} on channel {channel} before 'opened'")
        if kind is FrameKind.STDERR and record.pty:
            raise RemoteProtocolError(f"STDERR on channel {channel}, a PTY session")
        if record.output is not None and not record.output.spend(len(payload)):
            raise RemoteProtocolError(f"channel {channel}: output beyond the credit granted")
        return OutputReceived(channel, kind, payload) if payload else None

    def _control(self, channel: int, payload: bytes) -> ClientEvent | None:
        msg_type, obj = parse_object(payload)
        if msg_type not in SERVER_MESSAGES:
            return None
        try:
            message = convert_message(msg_type, obj, SERVER_MESSAGES)
        except RequestError as exc:
            raise RemoteProtocolError(exc.message) from exc
        if channel == 0:
            return self._connection_message(message)
        if isinstance(message, Error) and channel not in self.channels.used:
            return ErrorReceived(channel, message)  # the answer to a request on a new channel
        record = self._live(channel, repr(msg_type))
        if record is None:
            return None
        if isinstance(message, Error):
            if record.state is ChannelState.OPENING:
                self.channels.step(channel, Step.REFUSED)
                self._remember_end(channel)
                return OpenRefused(channel, message)
            return ErrorReceived(channel, message)
        if isinstance(message, Window):
            if record.stdin is not None:
                record.stdin.add(message.bytes)
            return StdinCreditGranted(channel, message.bytes)
        if isinstance(message, Skipped | Audience | Modes):
            if record.state is not ChannelState.OPEN:
                raise RemoteProtocolError(f"{msg_type!r} on channel {channel} before 'attached'")
            return NoticeReceived(channel, message)
        return self._step(channel, record, message, msg_type)

    def _step(self, channel: int, record: Channel, message: Message,
              msg_type: str) -> ClientEvent:
        """A message that moves the channel on: `opened`, `attached`, `exit`, `detached`."""
        step = _STEPS.get(type(message))
        if step is None or next_state(record.state, step) is None:
            raise RemoteProtocolError(
                f"{msg_type!r} on channel {channel} while it is {record.state.value}")
        self.channels.step(channel, step)
        if isinstance(message, Opened):
            if message.pty is not None:  # what the server did (one that does not say: as asked)
                record.pty = message.pty
            return OpenedReceived(channel, message)
        if isinstance(message, Attached):
            record.pty = message.pty
            return AttachedReceived(channel, message)
        self._remember_end(channel)
        if isinstance(message, Detached):
            return DetachedReceived(channel, message.reason)
        assert isinstance(message, Exit)
        return ExitReceived(channel, message)

    def _connection_message(self, message: Message) -> ClientEvent | None:
        if isinstance(message, Sessions):
            return SessionsReceived(message)
        if isinstance(message, Shared | Unshared | Targets):
            return AnswerReceived(message)
        if isinstance(message, Ping):
            return PingReceived()
        if isinstance(message, Pong):
            return None  # that something came is all it says
        if isinstance(message, Welcome):
            if self.welcome is not None:
                raise RemoteProtocolError("a second 'welcome'")
            self.welcome = message  # its max_frame bounds what we send; we receive by our own
            if self.hello_sent is not None and self.hello_sent.window is not None:
                for opened in self.channels.live.values():  # opened before the window was known
                    opened.stdin = Credit(message.window or 0)
            return WelcomeReceived(message)
        if not isinstance(message, Error):
            raise RemoteProtocolError(f"'{type(message).__name__.lower()}' on channel 0")
        named = message.channel
        if message.code == ErrorCode.CHANNEL_IN_USE and named is not None:
            named_record = self.channels.live.get(named)
            if named_record is not None and named_record.state is ChannelState.OPENING:
                self.channels.step(named, Step.REFUSED)
                self._remember_end(named)
                return OpenRefused(named, message)
        if message.code in REQUEST_REFUSALS:
            return AnswerReceived(message)
        return ErrorReceived(0, message)

    def _remember_end(self, channel: int) -> None:
        self._ended_by_server[channel] = None
        if len(self._ended_by_server) > RECENT_ENDS:
            self._ended_by_server.popitem(last=False)


_STEPS: dict[type[Message], Step] = {
    Opened: Step.OPENED, Attached: Step.OPENED, Exit: Step.EXITED, Detached: Step.DETACHED,
}


def _control_frame(channel: int, message: Message) -> bytes:
    return encode_frame(FrameKind.CTRL_IN, channel, encode_message(message))
