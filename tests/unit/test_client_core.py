"""The client's protocol core, with no event loop: a server that breaks a rule is caught at once."""

from __future__ import annotations

import pytest

from ttyserve.errors import LocalProtocolError, RemoteProtocolError
from ttyserve.protocol.client import (
    ClientConnection,
    ClientEvent,
    ErrorReceived,
    ExitReceived,
    OpenedReceived,
    OpenRefused,
    OutputReceived,
    StdinCreditGranted,
    WelcomeReceived,
)
from ttyserve.protocol.frames import FrameKind, encode_frame
from ttyserve.protocol.messages import (
    Error,
    Exit,
    Hello,
    Message,
    Open,
    Opened,
    Welcome,
    Window,
    encode_message,
)


def out(channel: int, message: Message | bytes) -> bytes:
    payload = message if isinstance(message, bytes) else encode_message(message)
    return encode_frame(FrameKind.CTRL_OUT, channel, payload)


def data(channel: int, payload: bytes, kind: FrameKind = FrameKind.STDOUT) -> bytes:
    return encode_frame(kind, channel, payload)


WELCOME = out(0, Welcome(protocol=1, server="s", max_frame=1 << 20, window=50))


def feed(core: ClientConnection, received: bytes) -> list[ClientEvent]:
    """Every event ``received`` makes (RemoteProtocolError at the first broken rule)."""
    core.receive_data(received)
    events = []
    while (event := core.next_event()) is not None:
        events.append(event)
    return events


def client(window: int | None = None, pty: bool = False, *channels: int) -> ClientConnection:
    core = ClientConnection()
    core.hello(Hello(protocol=1, multiplex=True, window=window))
    feed(core, WELCOME)
    for channel in channels:
        core.open(channel, Open(pty=pty))
        feed(core, out(channel, Opened(pid=channel)))
    return core


def test_a_session_from_welcome_to_exit() -> None:
    core = ClientConnection()
    core.hello(Hello(protocol=1))
    core.open(1, Open(pty=False))
    events = feed(core, WELCOME + out(1, Opened(pid=4)) + data(1, b"o")
                               + data(1, b"e", FrameKind.STDERR) + out(1, b'{"type":"new"}')
                               + out(1, Exit(code=0)))
    assert [type(e) for e in events] == [WelcomeReceived, OpenedReceived, OutputReceived,
                                         OutputReceived, ExitReceived]


@pytest.mark.parametrize("frames, match", [
    (out(1, Exit(code=0)) + data(1, b"late"), "after its last frame"),
    (out(1, Exit(code=0)) + out(1, Exit(code=1)), "after its last frame"),
    (out(1, Opened(pid=2)), "while it is open"),
    (data(2, b"x"), "never opened"),
    (data(1, b"x", FrameKind.STDIN), "not sent by servers"),
    (out(0, Opened(pid=1)), "on channel 0"),
    (WELCOME, "second 'welcome'"),
    (out(1, b'{"type": "exit", "code": "zero"}'), "exit"),
])
def test_server_rule_breaking_is_a_remote_protocol_error(frames: bytes, match: str) -> None:
    core = client(None, False, 1)
    with pytest.raises(RemoteProtocolError, match=match):
        feed(core, frames)


def test_output_before_opened_and_exit_before_opened_are_errors() -> None:
    for frame in (data(1, b"x"), out(1, Exit(code=0))):
        core = client()
        core.open(1, Open())
        with pytest.raises(RemoteProtocolError, match=r"opened|opening"):
            feed(core, frame)


def test_stderr_of_a_pty_session_is_an_error() -> None:
    core = client(None, True, 1)
    with pytest.raises(RemoteProtocolError, match="PTY"):
        feed(core, data(1, b"x", FrameKind.STDERR))


def test_what_opened_says_of_the_pty_is_what_counts() -> None:
    """A PTY asked for but refused by the server (`"pty": false` in `opened`) is a pipe
    session: its STDERR is fine. And the other way round."""
    core = client()
    core.open(1, Open(pty=True))
    core.open(2, Open(pty=False))
    feed(core, out(1, Opened(pid=1, pty=False)) + out(2, Opened(pid=2, pty=True)))
    assert feed(core, data(1, b"e", FrameKind.STDERR)) == [
        OutputReceived(1, FrameKind.STDERR, b"e")]
    with pytest.raises(RemoteProtocolError, match="PTY"):
        feed(core, data(2, b"x", FrameKind.STDERR))


def test_output_beyond_the_granted_credit_is_an_error() -> None:
    core = client(10, False, 1)
    feed(core, data(1, b"x" * 10))
    core.control(1, Window(bytes=5))
    feed(core, data(1, b"y" * 5, FrameKind.STDERR))
    assert feed(core, out(1, Exit(code=0))) == [ExitReceived(1, Exit(code=0))]
    core = client(10, False, 1)
    with pytest.raises(RemoteProtocolError, match="beyond the credit"):
        feed(core, data(1, b"x" * 11))


def test_frames_for_a_channel_we_cancelled_are_dropped_silently() -> None:
    core = client(10, False, 1)
    assert core.cancel(1)
    assert feed(core, data(1, b"x" * 100) + out(1, Exit(code=0))) == []
    assert core.cancel(1) == b""


def test_a_refused_open_ends_the_channel() -> None:
    core = client()
    core.open(1, Open())
    error = Error(code="busy", message="full", retriable=True)
    assert feed(core, out(1, error)) == [OpenRefused(1, error)]
    with pytest.raises(RemoteProtocolError):
        feed(core, out(1, Opened(pid=1)))


def test_channel_in_use_on_channel_0_refuses_the_named_open() -> None:
    core = client()
    core.open(3, Open())
    error = Error(code="channel_in_use", message="used", retriable=False, channel=3)
    assert feed(core, out(0, error)) == [OpenRefused(3, error)]
    other = Error(code="busy", message="too many connections", retriable=True)
    assert feed(core, out(0, other)) == [ErrorReceived(0, other)]


def test_stdin_credit_waits_for_welcome_and_grants() -> None:
    core = ClientConnection()
    core.hello(Hello(protocol=1, multiplex=True, window=1000))
    core.open(1, Open())
    assert core.stdin_credit(1) == 0  # the window is not known before `welcome`
    feed(core, WELCOME + out(1, Opened(pid=1)))
    assert core.stdin_credit(1) == 50
    core.stdin(1, b"x" * 50)
    with pytest.raises(LocalProtocolError, match="exceed its credit"):
        core.stdin(1, b"y")
    assert feed(core, out(1, Window(bytes=20))) == [StdinCreditGranted(1, 20)]
    assert core.stdin_credit(1) == 20


def test_requests_the_protocol_forbids_are_refused_locally() -> None:
    core = ClientConnection()
    with pytest.raises(LocalProtocolError, match="before 'hello'"):
        core.open(1, Open())
    core.hello(Hello(protocol=1))
    with pytest.raises(LocalProtocolError):
        core.hello(Hello(protocol=1))
    core.open(1, Open())
    with pytest.raises(LocalProtocolError, match="one session"):
        core.open(2, Open())
    with pytest.raises(LocalProtocolError, match="cannot be opened"):
        client().open(0, Open())
    with pytest.raises(LocalProtocolError, match="not live"):
        core.stdin(5, b"x")


def test_events_before_a_broken_rule_are_handed_out_first() -> None:
    core = client(None, False, 1)
    core.receive_data(out(1, Exit(code=0)) + data(1, b"late"))
    assert core.next_event() == ExitReceived(1, Exit(code=0))
    with pytest.raises(RemoteProtocolError, match="after its last frame"):
        core.next_event()
    with pytest.raises(RemoteProtocolError):  # and the connection stays broken
        core.next_event()
