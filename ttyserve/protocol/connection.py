"""Connection state for both ends of protocol v1, without I/O.

`ServerConnection` turns received bytes into events and owns every rule of
section 1 (hello first, directions, channel states); what it must answer by
itself (`unknown_message`, `bad_request`, `channel_in_use`) comes out as a
`Reply` event in order with the others, and refusals the I/O layer makes
through `reject()` wait in an outbox drained with `data_to_send()`. `ClientConnection` is the
mirror image for clients.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..errors import RemoteProtocolError, RequestError
from .codes import ErrorCode
from .frames import (
    CLIENT_KINDS,
    DEFAULT_MAX_FRAME,
    SERVER_KINDS,
    FrameDecoder,
    FrameKind,
    encode_frame,
)
from .messages import (
    CLIENT_MESSAGES,
    PROTOCOL_VERSION,
    SERVER_MESSAGES,
    Cancel,
    Error,
    Exit,
    Hello,
    Message,
    Open,
    Opened,
    Welcome,
    convert_message,
    encode_message,
    parse_object,
)


class ChannelState(enum.Enum):
    OPENING = "opening"  # `open` received, neither `opened` nor `error` sent yet
    OPEN = "open"  # `opened` sent: raw carriage until `exit`
    ENDED = "ended"  # `exit` or `error` sent, or cancelled: frames are discarded


# --- events a server receives ------------------------------------------------


@dataclass(frozen=True, slots=True)
class HelloReceived:
    hello: Hello


@dataclass(frozen=True, slots=True)
class OpenRequested:
    channel: int
    request: Open


@dataclass(frozen=True, slots=True)
class StdinReceived:
    channel: int
    data: bytes


@dataclass(frozen=True, slots=True)
class ControlReceived:
    """`resize`, `signal`, `eof` or `window` for a live channel."""

    channel: int
    message: Message


@dataclass(frozen=True, slots=True)
class CancelRequested:
    channel: int


@dataclass(frozen=True, slots=True)
class Reply:
    """A refusal the core answered with by itself, in order with the other events."""

    channel: int
    data: bytes


@dataclass(frozen=True, slots=True)
class OpenRejected:
    """The core refused an `open` by itself (`bad_request`); the error is in the outbox."""

    channel: int


ServerEvent = (
    HelloReceived | OpenRequested | StdinReceived | ControlReceived | CancelRequested
    | OpenRejected | Reply
)


def error_message(error: RequestError | RemoteProtocolError) -> Error:
    """The wire form of a refusal."""
    errno = error.errno if isinstance(error, RequestError) else None
    retry = error.retry_after_ms if isinstance(error, RequestError) else None
    return Error(
        code=str(error.code),
        message=error.message,
        errno=errno,
        retriable=error.retriable if isinstance(error, RequestError) else False,
        retry_after_ms=retry,
    )


def control_frame(kind: FrameKind, channel: int, message: Message) -> bytes:
    return encode_frame(kind, channel, encode_message(message))


class ServerConnection:
    """The server's view of one connection: validates input, tracks channels."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self._decoder = FrameDecoder(max_frame)
        self.max_frame = max_frame
        self.hello: Hello | None = None
        self.channels: dict[int, ChannelState] = {}
        self.exited: set[int] = set()  # channels whose `exit` was made: nothing may follow
        self._outbox: list[bytes] = []

    @property
    def pending(self) -> bool:
        """Whether refusals wait in the outbox."""
        return bool(self._outbox)

    def data_to_send(self) -> bytes:
        """Refusals queued with `reject` since the last call."""
        out = b"".join(self._outbox)
        self._outbox.clear()
        return out

    def receive_data(self, data: bytes) -> list[ServerEvent]:
        """Feed received bytes; return the events in order.

        Raises :class:`RemoteProtocolError` when the peer broke the protocol; events
        decoded before the offending frame are lost with the connection.
        """
        events: list[ServerEvent] = []
        for frame in self._decoder.feed(data):
            if frame.kind not in CLIENT_KINDS:
                raise RemoteProtocolError(f"frame kind {frame.kind.name} is not sent by clients")
            if self.hello is None:
                events.append(self._first_frame(frame.kind, frame.channel, frame.payload))
                continue
            if frame.kind is FrameKind.STDIN:
                state = self._known_channel(frame.channel, "data")
                if state is not ChannelState.ENDED and frame.payload:
                    events.append(StdinReceived(frame.channel, frame.payload))
            else:
                event = self._control(frame.channel, frame.payload)
                if self._outbox:
                    events.append(Reply(frame.channel, self.data_to_send()))
                if event is not None:
                    events.append(event)
        return events

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
                ErrorCode.UNSUPPORTED_PROTOCOL,
            )
        try:
            hello = convert_message(msg_type, obj, CLIENT_MESSAGES)
        except RequestError as exc:
            raise RemoteProtocolError(exc.message) from exc
        assert isinstance(hello, Hello)
        self.hello = hello
        return HelloReceived(hello)

    def _known_channel(self, channel: int, what: str) -> ChannelState:
        state = self.channels.get(channel)
        if state is None:
            raise RemoteProtocolError(f"{what} for channel {channel}, which was never opened")
        return state

    def _control(self, channel: int, payload: bytes) -> ServerEvent | None:
        msg_type, obj = parse_object(payload)
        if msg_type == "hello":
            raise RemoteProtocolError("a second 'hello'")
        if msg_type == "open":
            return self._open(channel, obj)
        state = self.channels.get(channel)
        if state is ChannelState.ENDED:
            return None
        if msg_type not in CLIENT_MESSAGES:
            self.reject(channel, RequestError(
                ErrorCode.UNKNOWN_MESSAGE, f"unknown message type {msg_type!r}"))
            return None
        if state is None:
            raise RemoteProtocolError(f"{msg_type!r} for channel {channel}, which was never opened")
        try:
            message = convert_message(msg_type, obj, CLIENT_MESSAGES)
        except RequestError as exc:
            self.reject(channel, exc)
            return None
        if isinstance(message, Cancel):
            self.channels[channel] = ChannelState.ENDED
            return CancelRequested(channel)
        return ControlReceived(channel, message)

    def _open(self, channel: int, obj: dict[str, object]) -> OpenRequested | OpenRejected | None:
        if channel == 0:
            raise RemoteProtocolError("'open' on channel 0")
        if channel in self.channels:
            self._outbox.append(control_frame(FrameKind.CTRL_OUT, channel, error_message(
                RequestError(ErrorCode.CHANNEL_IN_USE, f"channel {channel} was already used"))))
            return None
        self.channels[channel] = ChannelState.OPENING
        try:
            request = convert_message("open", obj, CLIENT_MESSAGES)
        except RequestError as exc:
            self.reject(channel, exc)
            return OpenRejected(channel)
        assert isinstance(request, Open)
        return OpenRequested(channel, request)

    # --- what the server sends ------------------------------------------------

    def welcome(self, server: str, window: int | None = None) -> bytes:
        return control_frame(FrameKind.CTRL_OUT, 0, Welcome(
            protocol=PROTOCOL_VERSION, server=server, max_frame=self.max_frame, window=window))

    def opened(self, channel: int, pid: int) -> bytes:
        if self.channels.get(channel) is ChannelState.OPENING:  # a cancel may have come first
            self.channels[channel] = ChannelState.OPEN
        return control_frame(FrameKind.CTRL_OUT, channel, Opened(pid=pid))

    def exit(self, channel: int, status: Exit) -> bytes:
        """The last frame of a channel."""
        self.channels[channel] = ChannelState.ENDED
        self.exited.add(channel)
        return control_frame(FrameKind.CTRL_OUT, channel, status)

    def reject(self, channel: int, error: RequestError | RemoteProtocolError) -> None:
        """Queue an `error` for ``channel``; a channel still opening ends with it."""
        if self.channels.get(channel) is ChannelState.OPENING:
            self.channels[channel] = ChannelState.ENDED
        self._outbox.append(control_frame(FrameKind.CTRL_OUT, channel, error_message(error)))

    def is_live(self, channel: int) -> bool:
        return self.channels.get(channel) in (ChannelState.OPENING, ChannelState.OPEN)


# --- events a client receives ------------------------------------------------


@dataclass(frozen=True, slots=True)
class WelcomeReceived:
    welcome: Welcome


@dataclass(frozen=True, slots=True)
class OpenedReceived:
    channel: int
    pid: int


@dataclass(frozen=True, slots=True)
class OutputReceived:
    channel: int
    kind: FrameKind  # STDOUT or STDERR
    data: bytes


@dataclass(frozen=True, slots=True)
class ExitReceived:
    channel: int
    exit: Exit


@dataclass(frozen=True, slots=True)
class ErrorReceived:
    channel: int
    error: Error


ClientEvent = WelcomeReceived | OpenedReceived | OutputReceived | ExitReceived | ErrorReceived


class ClientConnection:
    """The client's view of one connection: encodes requests, decodes answers."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self._decoder = FrameDecoder(max_frame)

    def hello(self, hello: Hello) -> bytes:
        return control_frame(FrameKind.CTRL_IN, 0, hello)

    def control(self, channel: int, message: Message) -> bytes:
        return control_frame(FrameKind.CTRL_IN, channel, message)

    def stdin(self, channel: int, data: bytes) -> bytes:
        return encode_frame(FrameKind.STDIN, channel, data)

    def receive_data(self, data: bytes) -> list[ClientEvent]:
        """Feed received bytes; unknown message types are ignored, as the contract asks."""
        events: list[ClientEvent] = []
        for frame in self._decoder.feed(data):
            if frame.kind not in SERVER_KINDS:
                raise RemoteProtocolError(f"frame kind {frame.kind.name} is not sent by servers")
            if frame.kind is not FrameKind.CTRL_OUT:
                if frame.payload:
                    events.append(OutputReceived(frame.channel, frame.kind, frame.payload))
                continue
            msg_type, obj = parse_object(frame.payload)
            if msg_type not in SERVER_MESSAGES:
                continue
            try:
                message = convert_message(msg_type, obj, SERVER_MESSAGES)
            except RequestError as exc:
                raise RemoteProtocolError(exc.message) from exc
            if isinstance(message, Welcome):
                self._decoder.max_frame = max(self._decoder.max_frame, message.max_frame)
                events.append(WelcomeReceived(message))
            elif isinstance(message, Opened):
                events.append(OpenedReceived(frame.channel, message.pid))
            elif isinstance(message, Exit):
                events.append(ExitReceived(frame.channel, message))
            elif isinstance(message, Error):
                events.append(ErrorReceived(frame.channel, message))
        return events
