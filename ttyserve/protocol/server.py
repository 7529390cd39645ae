"""The server's end of protocol v1, without I/O: every rule of sections 1, 3, 4, 7, 9, 10 and
11 (what an observer and a grant's connection may send).

Bytes go in with `receive_data`; `next_event` hands out one event at a time,
so the I/O layer's decisions (accept a hello, admit an open) take effect
before the next frame is looked at. Every frame the server sends is made
here and waits in one ordered buffer, `data_to_send`: answers keep the order
of the requests, and nothing is ever framed on a channel that has ended.
"""

from __future__ import annotations

import enum

import msgspec

from ..defaults import DEFAULT_STDIN_WINDOW
from ..errors import ErrorCode, LocalProtocolError, ProtocolError, RemoteProtocolError, RequestError
from .channels import ChannelState, ChannelTable, Step
from .frames import (
    CLIENT_KINDS,
    DEFAULT_MAX_FRAME,
    HEADER,
    Frame,
    FrameDecoder,
    FrameKind,
    FrameQueue,
    encode_frame,
)
from .messages import (
    CLIENT_MESSAGES,
    OBSERVER,
    PROTOCOL_VERSION,
    WRITER,
    Attach,
    Attached,
    Audience,
    Cancel,
    Detach,
    Detached,
    Exit,
    GrantScope,
    Hello,
    List,
    ListTargets,
    Message,
    Modes,
    Offsets,
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
    error_message,
    parse_object,
)

Buffer = bytes | bytearray | memoryview
# what goes on channel 0 only
_CHANNEL_0_TYPES = (List, Release, Ping, Pong, Share, Unshare, ListTargets)
_CHANNEL_0 = frozenset(cls.__struct_config__.tag for cls in _CHANNEL_0_TYPES)
# Channel 0 requests refused with an `error` there, the connection going on.
_REQUESTS_0 = frozenset(cls.__struct_config__.tag for cls in (Share, Unshare))


class Stage(enum.Enum):
    """Where a connection is (the server's view)."""

    AWAITING_HELLO = "awaiting hello"
    DECIDING = "deciding"  # `hello` received: answer it with accept_hello() or close()
    READY = "ready"  # `welcome` sent
    CLOSING = "closing"  # the connection's last frame is made: nothing more is read or framed


# --- events -------------------------------------------------------------------


class HelloReceived(msgspec.Struct, frozen=True):
    hello: Hello


class OpenRequested(msgspec.Struct, frozen=True):
    """Admit it (then `opened`) or refuse it (`refuse`)."""

    channel: int
    request: Open


class AttachRequested(msgspec.Struct, frozen=True):
    """Answer it with `attached` or refuse it, as an `open`."""

    channel: int
    request: Attach


class DetachRequested(msgspec.Struct, frozen=True):
    """`detach` on a live channel: answer `send_detached`, or refuse it."""

    channel: int


class ListRequested(msgspec.Struct, frozen=True):
    """`list` on channel 0: `answer` it with `sessions`."""


class TargetsRequested(msgspec.Struct, frozen=True):
    """`targets` on channel 0: `answer` it with `targets` (section 15)."""


class StdinReceived(msgspec.Struct, frozen=True):
    channel: int
    data: bytes


class ControlReceived(msgspec.Struct, frozen=True):
    """`resize`, `signal` or `eof` for a live channel."""

    channel: int
    message: Message


class CreditGranted(msgspec.Struct, frozen=True):
    """A `window` added ``bytes`` of output credit to a live channel: waiting output may go
    on."""

    channel: int
    bytes: int = 0


class ReleaseRequested(msgspec.Struct, frozen=True):
    """`release` on channel 0: the client read an ended session's exit (section 10)."""

    session: str


class ShareRequested(msgspec.Struct, frozen=True):
    """`share` on channel 0: `answer` it with `shared`, or `refuse_request`."""

    request: Share


class UnshareRequested(msgspec.Struct, frozen=True):
    """`unshare` on channel 0: `answer` it with `unshared`, or `refuse_request`."""

    request: Unshare


class CancelRequested(msgspec.Struct, frozen=True):
    """The channel has ended; its session is to be ended with nothing more sent."""

    channel: int


ServerEvent = (
    HelloReceived | OpenRequested | AttachRequested | StdinReceived | ControlReceived
    | CreditGranted | CancelRequested | DetachRequested | ListRequested | ReleaseRequested
    | ShareRequested | UnshareRequested | TargetsRequested
)


class ServerConnection:
    """One connection as the server sees it."""

    _last_word: RequestError | None = None  # `close_when_over`'s error (set when used)

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME,
                 stdin_window: int = DEFAULT_STDIN_WINDOW, output_frame: int | None = None,
                 ) -> None:
        self.max_frame = max_frame
        # The largest output frame this server makes: ``output_frame`` (what one read of a
        # process's output takes), within what the client accepts.
        self.output_frame = min(output_frame or max_frame, max_frame)
        self.stage = Stage.AWAITING_HELLO
        self.hello: Hello | None = None
        self.channels = ChannelTable()
        self._stdin_window = stdin_window
        self._decoder = FrameDecoder(max_frame)
        self._frames = FrameQueue()
        self._out: list[Buffer] = []
        self._session: int | None = None  # single-session: the channel that carries it
        self._undecided: int | None = None  # the `open` whose answer the I/O layer owes
        self._listed = False  # a `list` was asked: it satisfies the handshake as `open` does
        self.scope: GrantScope | None = None  # admitted by a grant: all it may do (section 11)
        self.error: ProtocolError | None = None  # why the connection closed, if the protocol broke

    # --- what the I/O layer asks ------------------------------------------------

    @property
    def multiplex(self) -> bool:
        return self.hello is not None and self.hello.multiplex

    @property
    def windowed(self) -> bool:
        """Whether credit applies in both directions (`hello` carried `window`)."""
        return self.hello is not None and self.hello.window is not None

    @property
    def stdin_window(self) -> int | None:
        """The STDIN credit each channel starts with, or None without windows."""
        return self._stdin_window if self.windowed else None

    @property
    def handshake_done(self) -> bool:
        """`hello` answered and, on a single-session connection, its session asked for."""
        return self.stage is Stage.READY and (
            self.multiplex or self._session is not None or self._listed)

    @property
    def closing(self) -> bool:
        return self.stage is Stage.CLOSING

    @property
    def pending(self) -> bool:
        """Whether framed bytes wait in the send buffer."""
        return bool(self._out)

    def data_to_send(self) -> list[Buffer]:
        """Everything framed since the last call, in order (payloads are not copied)."""
        out, self._out = self._out, []
        return out

    def output_credit(self, channel: int) -> int | None:
        """Output the channel may still send: None for no limit, 0 once it has ended."""
        record = self.channels.live.get(channel)
        if record is None:
            return 0
        return None if record.output is None else record.output.available

    def output_limit(self, channel: int) -> int:
        """The most the next output frame of ``channel`` may carry: its credit, within one
        frame (`output_frame`); 0 without credit, before `opened` or once it has ended."""
        record = self.channels.live.get(channel)
        if record is None or record.state is not ChannelState.OPEN or self.closing:
            return 0
        if record.output is None:
            return self.output_frame
        return min(record.output.available, self.output_frame)

    # --- input ------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Feed received bytes; take the events out with `next_event`."""
        if self.stage is not Stage.CLOSING:
            self._frames.extend(self._decoder.feed(data))

    def next_event(self) -> ServerEvent | None:
        """The next event, or None until more data comes.

        Raises RemoteProtocolError when the peer broke the protocol; the
        `protocol_error` answer is then framed and the connection is closing.
        """
        if self.stage is Stage.DECIDING:
            raise LocalProtocolError("answer 'hello' with accept_hello() or close() first")
        if self._undecided is not None and self.stage is not Stage.CLOSING:
            raise LocalProtocolError(f"answer the 'open' on channel {self._undecided} with "
                                     "opened() or refuse() first (answers keep request order)")
        while self.stage is not Stage.CLOSING:
            if not self._frames:
                if self._decoder.error is not None:
                    self._fail(self._decoder.error)
                return None
            try:
                event = self._receive(self._frames.popleft())
            except RemoteProtocolError as exc:
                self._fail(exc)
            if event is not None:
                return event
        self._frames.clear()
        return None

    def _fail(self, error: RemoteProtocolError) -> None:
        self.close(error)
        raise error

    def _receive(self, frame: Frame) -> ServerEvent | None:
        kind, channel, payload = frame.kind, frame.channel, frame.payload
        if kind not in CLIENT_KINDS:
            raise RemoteProtocolError(f"frame kind {kind.name} is not sent by clients")
        if self.stage is Stage.AWAITING_HELLO:
            return self._first_frame(kind, channel, payload)
        if kind is FrameKind.STDIN:
            return self._stdin(channel, payload)
        return self._control(channel, payload)

    def _first_frame(self, kind: FrameKind, channel: int, payload: bytes) -> HelloReceived:
        if kind is not FrameKind.CTRL_IN or channel != 0:
            raise RemoteProtocolError("the first frame must be 'hello' on channel 0")
        msg_type, obj = parse_object(payload)
        if msg_type != "hello":
            raise RemoteProtocolError(f"the first message must be 'hello', not {msg_type!r}")
        protocol = obj.get("protocol")
        if not isinstance(protocol, int) or isinstance(protocol, bool):
            raise RemoteProtocolError("'hello' needs an integer member 'protocol'")
        if protocol != PROTOCOL_VERSION:
            raise RemoteProtocolError(
                f"protocol {protocol!r} is not supported; this server speaks {PROTOCOL_VERSION}",
                ErrorCode.UNSUPPORTED_PROTOCOL)
        try:
            hello = convert_message(msg_type, obj, CLIENT_MESSAGES)
        except RequestError as exc:
            raise RemoteProtocolError(exc.message) from exc
        assert isinstance(hello, Hello)
        self.hello = hello
        self.stage = Stage.DECIDING
        return HelloReceived(hello)

    def _stdin(self, channel: int, payload: bytes) -> StdinReceived | None:
        record = self.channels.live.get(channel)
        if record is None:
            if channel in self.channels.used:
                return None  # the channel has ended: discarded without a word
            raise RemoteProtocolError(f"data for channel {channel}, which was never opened")
        if record.observer:
            return None  # an observer's keys reach nothing (and spend no credit)
        if record.stdin is not None and not record.stdin.spend(len(payload)):
            raise RemoteProtocolError(
                f"channel {channel}: STDIN beyond the window the server granted")
        return StdinReceived(channel, payload) if payload else None

    def _control(self, channel: int, payload: bytes) -> ServerEvent | None:
        msg_type, obj = parse_object(payload)
        if msg_type == "hello":
            raise RemoteProtocolError("a second 'hello'")
        if msg_type in ("open", "attach"):
            return self._open(channel, msg_type, obj)
        if channel == 0 and msg_type in _CHANNEL_0:
            return self._connection_message(msg_type, obj)
        state = self.channels.state(channel)
        if state is ChannelState.ENDED:
            return None
        if msg_type not in CLIENT_MESSAGES:
            self._frame_error(channel, RequestError(
                ErrorCode.UNKNOWN_MESSAGE, f"unknown message type {msg_type!r}"))
            return None
        if state is None:
            raise RemoteProtocolError(
                f"{msg_type!r} for channel {channel}, which was never opened")
        try:
            message = convert_message(msg_type, obj, CLIENT_MESSAGES)
        except RequestError as exc:
            self._frame_error(channel, exc)
            return None
        if self.channels.live[channel].observer and not isinstance(message, Detach | Window):
            self._frame_error(channel, RequestError(
                ErrorCode.READ_ONLY, f"{msg_type!r} is the writer's to send: this channel "
                "observes the session"))
            return None
        if isinstance(message, Cancel):
            self.channels.step(channel, Step.CANCELLED)
            self._channel_ended(channel)
            return CancelRequested(channel)
        if isinstance(message, Window):
            credit = self.channels.live[channel].output
            if credit is None:
                return None  # no windows on this connection: nothing to add to
            credit.add(message.bytes)
            return CreditGranted(channel, message.bytes)
        if isinstance(message, _CHANNEL_0_TYPES):
            self._frame_error(channel, RequestError(ErrorCode.BAD_REQUEST,
                                                    f"{msg_type!r} goes on channel 0"))
            return None
        if isinstance(message, Detach):
            return DetachRequested(channel)
        return ControlReceived(channel, message)

    def _connection_message(self, msg_type: str, obj: dict[str, object],
                            ) -> ServerEvent | None:
        """`list`, `release`, `ping`, `pong`, `share` and `unshare` on channel 0; a `ping` is
        answered here. A grant's connection may do none but ping."""
        try:
            message = convert_message(msg_type, obj, CLIENT_MESSAGES)
        except RequestError as exc:
            if msg_type in _REQUESTS_0:
                self._frame_error(0, exc)
                return None
            raise RemoteProtocolError(exc.message) from exc  # channel 0 has no other answer
        if isinstance(message, Release) and (scope := self.scope) is not None:
            # Only a writer's grant may let its session's kept exit go; an observer's client
            # releases what it read, which is not the owner's to lose: ignored, as unknown.
            return (ReleaseRequested(message.session)
                    if scope.role == WRITER and message.session == scope.session else None)
        if self.scope is not None and not isinstance(message, Ping | Pong):
            self._frame_error(0, RequestError(
                ErrorCode.FORBIDDEN, f"{msg_type!r} is not for a connection admitted by a grant "
                f"(it may only attach session {self.scope.session})"))
            return None
        if isinstance(message, Share):
            return ShareRequested(message)
        if isinstance(message, Unshare):
            return UnshareRequested(message)
        if isinstance(message, Ping):
            self._frame_control(0, Pong())
            return None
        if isinstance(message, Release):
            return ReleaseRequested(message.session)
        if isinstance(message, List):
            self._listed = True
            return ListRequested()
        if isinstance(message, ListTargets):
            self._listed = True
            return TargetsRequested()
        return None  # a `pong`: that something came is all it says

    def ping(self) -> None:
        """Frame a `ping` on channel 0 (the heartbeat: nothing else was sent for a while)."""
        if self.stage is Stage.READY:
            self._frame_control(0, Ping())

    def _open(self, channel: int, msg_type: str, obj: dict[str, object],
              ) -> OpenRequested | AttachRequested | None:
        """`open` and `attach`: each begins a channel, and is answered before the next frame."""
        if channel == 0:
            raise RemoteProtocolError(f"{msg_type!r} on channel 0")
        state = self.channels.state(channel)
        if state is ChannelState.ENDED:  # answered on channel 0: nothing follows a channel's end
            self._frame_error(0, RequestError(
                ErrorCode.CHANNEL_IN_USE, f"channel {channel} was already used"), channel)
            return None
        if state is not None:
            self._frame_error(channel, RequestError(
                ErrorCode.CHANNEL_IN_USE, f"channel {channel} is in use"))
            return None
        self.channels.used.add(channel)  # a refused open uses its id too
        if not self.multiplex:
            if self._session is not None:
                self._frame_error(channel, RequestError(
                    ErrorCode.BAD_REQUEST,
                    "this connection carries one session (hello.multiplex is false)"))
                return None
            self._session = channel
        try:
            request = convert_message(msg_type, obj, CLIENT_MESSAGES)
        except RequestError as exc:
            self._frame_error(channel, exc)
            self._channel_ended(channel)
            return None
        if (refusal := self._outside_scope(request)) is not None:
            self._frame_error(channel, refusal)
            self._channel_ended(channel)
            return None
        assert self.hello is not None
        self.channels.begin(channel, not isinstance(request, Open) or request.pty,
                            self.hello.window, self._stdin_window)
        self._undecided = channel
        if isinstance(request, Attach):
            return AttachRequested(channel, request)
        assert isinstance(request, Open)
        return OpenRequested(channel, request)

    def _outside_scope(self, request: Message) -> RequestError | None:
        """Why a grant's connection may not send this `open` or `attach` (section 11)."""
        scope = self.scope
        if scope is None:
            return None
        if not isinstance(request, Attach):
            return RequestError(ErrorCode.FORBIDDEN, "a connection admitted by a grant may "
                                f"only attach session {scope.session}, not open one")
        if request.session != scope.session:
            return RequestError(ErrorCode.FORBIDDEN, "this grant is for session "
                                f"{scope.session}, not {request.session}")
        if request.role != OBSERVER and scope.role == OBSERVER:
            return RequestError(ErrorCode.FORBIDDEN, "this grant lets its holder observe the "
                                "session, not write to it: attach with role observer")
        return None

    # --- decisions and frames ---------------------------------------------------

    def accept_hello(self, server: str, scope: GrantScope | None = None) -> None:
        """Answer `hello` with `welcome` (with the STDIN window when windows are on); with
        ``scope``, the connection was admitted by a grant and may do that alone."""
        if self.stage is not Stage.DECIDING:
            raise LocalProtocolError(f"no 'hello' to accept ({self.stage.value})")
        assert self.hello is not None
        self.scope = scope
        self._frame_control(0, Welcome(protocol=PROTOCOL_VERSION, server=server,
                                       max_frame=self.max_frame, window=self.stdin_window,
                                       heartbeat=self.hello.heartbeat, grant=scope))
        self.stage = Stage.READY

    def close(self, error: RequestError | ProtocolError | None = None) -> None:
        """End the connection, after an `error` on channel 0 if one is given.

        Nothing more is read or framed; what is already framed still goes out.
        """
        if self.stage is Stage.CLOSING:
            return
        if error is not None:
            self._frame_error(0, error)
        if isinstance(error, ProtocolError):
            self.error = error
        self.stage = Stage.CLOSING

    def close_when_over(self, error: RequestError) -> None:
        """End the connection with ``error`` on channel 0 once no channel is live: now when
        none is, else right after the last one's last frame (an upgrade's
        `server_restarting` follows the `exit` of a session it ended, section 12)."""
        if not self.channels.live:
            self.close(error)
        else:
            self._last_word = error

    def opened(self, channel: int, answer: Opened) -> bool:
        """Answer `open` with `opened` (the command that runs, a detachable session's id);
        False when the connection closed meanwhile."""
        if self.stage is Stage.CLOSING or not self.channels.step(channel, Step.OPENED):
            return False
        self._decided(channel)
        self._frame_control(channel, answer)
        return True

    def attached(self, channel: int, answer: Attached) -> bool:
        """Answer `attach` with `attached` (the scrollback and live output follow)."""
        if self.stage is Stage.CLOSING or not self.channels.step(channel, Step.OPENED):
            return False
        self._decided(channel)
        record = self.channels.live[channel]
        record.pty = answer.pty
        record.observer = answer.role == OBSERVER
        self._frame_control(channel, answer)
        return True

    def send_detached(self, channel: int, reason: str | None = None) -> bool:
        """Frame `detached`, the channel's last frame: its session goes on without it."""
        if self.stage is Stage.CLOSING or not self.channels.step(channel, Step.DETACHED):
            return False
        self._frame_control(channel, Detached(reason=reason))
        self._channel_ended(channel)
        return True

    def answer(self, answer: Sessions | Shared | Unshared | Targets) -> None:
        """Answer `list`, `share`, `unshare` or `targets` on channel 0 (answers keep request
        order)."""
        if self.stage is not Stage.CLOSING:
            self._frame_control(0, answer)

    def refuse_request(self, error: RequestError) -> None:
        """Answer a `share` or `unshare` with `error` on channel 0; the connection goes on."""
        if self.stage is not Stage.CLOSING:
            self._frame_error(0, error)

    def send_skipped(self, channel: int, size: int, offsets: Offsets) -> bool:
        """Tell an observer that ``size`` bytes were skipped: its streams go on at
        ``offsets``; False once the channel has ended."""
        return self._frame_live(channel, Skipped(bytes=size, offsets=offsets))

    def send_audience(self, channel: int, observers: int) -> bool:
        """Tell the writer how many observers watch now."""
        return self._frame_live(channel, Audience(observers=observers))

    def send_modes(self, channel: int, modes: Modes) -> bool:
        """Tell a channel that asked the terminal's state (section 14), before the output it
        covers; False once the channel has ended."""
        return self._frame_live(channel, modes)

    def is_open(self, channel: int) -> bool:
        """Whether ``channel`` is open (answered, not ended) on a connection not closing."""
        record = self.channels.live.get(channel)
        return (self.stage is not Stage.CLOSING and record is not None
                and record.state is ChannelState.OPEN)

    def _frame_live(self, channel: int, message: Message) -> bool:
        if not self.is_open(channel):
            return False
        self._frame_control(channel, message)
        return True

    def refuse(self, channel: int, error: RequestError) -> bool:
        """Answer a request on ``channel`` with `error`; refusing an `open` ends the channel.

        False when the channel has already ended (nothing is framed).
        """
        if channel == 0:
            raise LocalProtocolError("refusals on channel 0 end the connection: use close()")
        if self.stage is Stage.CLOSING:
            return False
        state = self.channels.state(channel)
        if state is ChannelState.OPENING:
            self.channels.step(channel, Step.REFUSED)
            self._decided(channel)
        elif state is None:
            raise LocalProtocolError(f"channel {channel} was never opened")
        elif state is ChannelState.ENDED:
            return False
        self._frame_error(channel, error)
        if state is ChannelState.OPENING:
            self._channel_ended(channel)
        return True

    def send_output(self, channel: int, kind: FrameKind, data: Buffer) -> bool:
        """Frame output, spending the channel's credit; the payload is not copied.

        False once the channel has ended; LocalProtocolError for output the
        protocol forbids (before `opened`, beyond the credit, STDERR of a PTY).
        """
        if not self.send_output_header(channel, kind, len(data)):
            return False
        self._out.append(data)
        return True

    def send_output_header(self, channel: int, kind: FrameKind, size: int) -> bool:
        """`send_output` of a payload of ``size`` bytes that the caller sends itself, right
        after what `data_to_send` hands out next (spliced from a pipe, say)."""
        if not self.spend_output(channel, kind, size):
            return False
        self._out.append(HEADER.pack(kind, channel, size))
        return True

    def spend_output(self, channel: int, kind: FrameKind, size: int) -> bool:
        """Take the credit of ``size`` bytes of output that is delivered in this process
        rather than framed (an HTTP output stream reads it: transport/direct.py), by
        `send_output`'s rules; False once the channel has ended."""
        if self.stage is Stage.CLOSING:
            return False
        record = self.channels.live.get(channel)
        if record is None or record.state is not ChannelState.OPEN:
            if record is None and channel in self.channels.used:
                return False
            raise LocalProtocolError(f"channel {channel} is not open")
        if kind is not FrameKind.STDOUT and (kind is not FrameKind.STDERR or record.pty):
            raise LocalProtocolError(f"{kind.name} is not output of this channel")
        if record.output is not None and not record.output.spend(size):
            raise LocalProtocolError(f"channel {channel}: {size} bytes of output exceed "
                                     f"its credit of {record.output.available}")
        return True

    def send_exit(self, channel: int, status: Exit) -> bool:
        """Frame the channel's last frame, `exit` (it needs no credit)."""
        if self.stage is Stage.CLOSING or not self.channels.step(channel, Step.EXITED):
            return False
        self._frame_control(channel, status)
        self._channel_ended(channel)
        return True

    def stdin_consumed(self, channel: int, size: int) -> None:
        """The process took ``size`` bytes of the channel's input: grant them back once
        half the window was taken (so a client always has at least half to send)."""
        record = self.channels.live.get(channel)
        if record is None or record.stdin is None or self.stage is Stage.CLOSING:
            return
        if grant := record.stdin.consumed(size):
            self._frame_control(channel, Window(bytes=grant))

    def _decided(self, channel: int) -> None:
        if self._undecided == channel:
            self._undecided = None

    def _channel_ended(self, channel: int) -> None:
        if self._last_word is not None and not self.channels.live:
            self.close(self._last_word)
        elif channel == self._session:
            self.stage = Stage.CLOSING  # single-session: the session's last frame ends it

    def _frame_control(self, channel: int, message: Message) -> None:
        self._out.append(encode_frame(FrameKind.CTRL_OUT, channel, encode_message(message)))

    def _frame_error(self, channel: int, error: RequestError | ProtocolError,
                     names: int | None = None) -> None:
        self._frame_control(channel, error_message(error, names))
