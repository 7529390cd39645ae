"""The sans-I/O connection rules of protocol v1, section 1, without any I/O."""

from __future__ import annotations

import pytest
from helpers import HELLO, ctrl

from ttyserve.errors import RemoteProtocolError as ProtocolError
from ttyserve.protocol.codes import ErrorCode
from ttyserve.protocol.connection import (
    CancelRequested,
    ClientConnection,
    ControlReceived,
    ExitReceived,
    HelloReceived,
    OpenedReceived,
    OpenRejected,
    OpenRequested,
    OutputReceived,
    Reply,
    ServerConnection,
    StdinReceived,
    WelcomeReceived,
)
from ttyserve.protocol.frames import FrameDecoder, FrameKind, encode_frame
from ttyserve.protocol.messages import Exit, Hello, Open, Resize, parse_object


def replies(core: ServerConnection, events: list[object] | None = None,
            ) -> list[tuple[int, dict[str, object]]]:
    data = b"".join(e.data for e in events or [] if isinstance(e, Reply)) + core.data_to_send()
    return [(f.channel, parse_object(f.payload)[1]) for f in FrameDecoder().feed(data)]


def opened_core() -> ServerConnection:
    core = ServerConnection()
    events = core.receive_data(HELLO + ctrl(1, Open(argv=["true"])))
    assert isinstance(events[0], HelloReceived) and isinstance(events[1], OpenRequested)
    core.opened(1, 42)
    return core


def test_hello_then_pipelined_open_and_stdin() -> None:
    core = ServerConnection()
    events = core.receive_data(HELLO + ctrl(1, Open(argv=["cat"])) + encode_frame(
        FrameKind.STDIN, 1, b"hi"))
    assert [type(e) for e in events] == [HelloReceived, OpenRequested, StdinReceived]


@pytest.mark.parametrize("data, match", [
    (ctrl(1, Open()), "first frame"),
    (encode_frame(FrameKind.STDIN, 0, b"x"), "first frame"),
    (ctrl(0, {"type": "open"}), "first message must be 'hello'"),
    (HELLO + HELLO, "second 'hello'"),
    (HELLO + ctrl(0, Open()), "'open' on channel 0"),
    (HELLO + encode_frame(FrameKind.STDIN, 5, b"x"), "never opened"),
    (HELLO + ctrl(5, Resize(rows=1, cols=1)), "never opened"),
    (HELLO + ctrl(0, Resize(rows=1, cols=1)), "never opened"),
    (HELLO + encode_frame(FrameKind.STDOUT, 1, b"x"), "not sent by clients"),
    (HELLO + encode_frame(FrameKind.CTRL_OUT, 0, b"{}"), "not sent by clients"),
    (HELLO + ctrl(1, b"{bad json"), "not valid"),
    (HELLO + ctrl(1, b'{"type": 1}'), "string member 'type'"),
    (ctrl(0, {"type": "hello", "protocol": "1"}), "integer member 'protocol'"),
])
def test_protocol_errors(data: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match) as info:
        ServerConnection().receive_data(data)
    assert info.value.code is ErrorCode.PROTOCOL_ERROR


def test_unsupported_protocol_version() -> None:
    with pytest.raises(ProtocolError) as info:
        ServerConnection().receive_data(ctrl(0, Hello(protocol=2)))
    assert info.value.code is ErrorCode.UNSUPPORTED_PROTOCOL


def test_unknown_message_answers_and_goes_on() -> None:
    core = opened_core()
    events = core.receive_data(ctrl(1, {"type": "dance"}) + ctrl(0, {"type": "x"}))
    assert [e.channel for e in events if isinstance(e, Reply)] == [1, 0]
    assert [(ch, r["code"]) for ch, r in replies(core, events)] == [
        (1, "unknown_message"), (0, "unknown_message")]


def test_bad_control_members_answer_bad_request_and_session_goes_on() -> None:
    core = opened_core()
    events = core.receive_data(ctrl(1, {"type": "signal", "name": "NOPE"})
                               + ctrl(1, Resize(rows=3, cols=4)))
    assert events[1:] == [ControlReceived(1, Resize(rows=3, cols=4))]
    assert replies(core, events)[0][1]["code"] == "bad_request"
    assert core.is_live(1)


def test_bad_open_is_rejected_and_ends_the_channel() -> None:
    core = ServerConnection()
    events = core.receive_data(HELLO + ctrl(3, {"type": "open", "rows": 0}))
    assert events[2] == OpenRejected(3)
    (channel, reply), = replies(core, events)
    assert channel == 3 and reply["code"] == "bad_request" and "rows" in str(reply["message"])
    # Frames for the ended channel are discarded without a word.
    late = encode_frame(FrameKind.STDIN, 3, b"x") + ctrl(3, {"type": "eof"})
    assert core.receive_data(late) == []
    assert core.data_to_send() == b""


def test_channel_in_use() -> None:
    core = opened_core()
    events = core.receive_data(ctrl(1, Open()))
    assert replies(core, events) == [(1, {"type": "error", "code": "channel_in_use",
                                  "message": "channel 1 was already used", "retriable": False})]


def test_cancel_ends_the_channel_and_later_frames_are_discarded() -> None:
    core = opened_core()
    assert core.receive_data(ctrl(1, {"type": "cancel"})) == [CancelRequested(1)]
    assert core.receive_data(encode_frame(FrameKind.STDIN, 1, b"late")) == []
    assert not core.is_live(1)


def test_exit_ends_the_channel() -> None:
    core = opened_core()
    frame = FrameDecoder().feed(core.exit(1, Exit(code=3)))[0]
    assert core.exited == {1}  # the I/O layer drops any later reply for it
    assert parse_object(frame.payload)[1] == {"type": "exit", "code": 3}
    assert core.receive_data(encode_frame(FrameKind.STDIN, 1, b"late")) == []


def test_empty_stdin_frame_means_nothing() -> None:
    core = opened_core()
    assert core.receive_data(encode_frame(FrameKind.STDIN, 1, b"")) == []


def test_client_side_decodes_answers_and_ignores_unknown_types() -> None:
    server = opened_core()
    client = ClientConnection()
    data = (server.welcome("ttyserve/x") + encode_frame(FrameKind.CTRL_OUT, 1, b'{"type":"new"}')
            + encode_frame(FrameKind.STDOUT, 1, b"out") + server.exit(1, Exit(code=0)))
    events = client.receive_data(data)
    assert [type(e) for e in events] == [WelcomeReceived, OutputReceived, ExitReceived]
    assert client.receive_data(server.opened(2, 7)) == [OpenedReceived(2, 7)]


def test_client_refuses_client_kinds_from_the_server() -> None:
    with pytest.raises(ProtocolError):
        ClientConnection().receive_data(encode_frame(FrameKind.STDIN, 1, b"x"))
