"""The server's protocol core, with no event loop: every rule of sections 1, 3, 4 and 7, and
section 11's (what an observer and a grant's connection may send)."""

from __future__ import annotations

import json
import random

import pytest
from helpers import HELLO, ctrl

from ttyserve.errors import ErrorCode, LocalProtocolError, RemoteProtocolError, RequestError
from ttyserve.protocol.channels import ChannelState
from ttyserve.protocol.frames import Frame, FrameDecoder, FrameKind, encode_frame
from ttyserve.protocol.messages import (
    Attached,
    Exit,
    GrantScope,
    Hello,
    Open,
    Opened,
    Resize,
    Window,
    parse_object,
)
from ttyserve.protocol.server import (
    AttachRequested,
    CancelRequested,
    ControlReceived,
    CreditGranted,
    DetachRequested,
    HelloReceived,
    OpenRequested,
    ReleaseRequested,
    ServerConnection,
    ServerEvent,
    ShareRequested,
    StdinReceived,
)

WINDOWED = ctrl(0, Hello(protocol=1, multiplex=True, window=100))
MULTIPLEX = ctrl(0, Hello(protocol=1, multiplex=True))


def sent(core: ServerConnection) -> list[Frame]:
    return FrameDecoder(1 << 30).feed(b"".join(bytes(b) for b in core.data_to_send()))


def controls(core: ServerConnection) -> list[tuple[int, dict[str, object]]]:
    return [(f.channel, parse_object(f.payload)[1]) for f in sent(core)
            if f.kind is FrameKind.CTRL_OUT]


def events(core: ServerConnection, data: bytes = b"", admit: bool = True) -> list[ServerEvent]:
    """Feed ``data`` and act as the I/O layer would: accept hellos, admit (or refuse) opens."""
    core.receive_data(data)
    out: list[ServerEvent] = []
    while (event := core.next_event()) is not None:
        out.append(event)
        if isinstance(event, HelloReceived):
            core.accept_hello("test")
        elif isinstance(event, OpenRequested):
            if admit:
                core.opened(event.channel, Opened(pid=100 + event.channel))
            else:
                core.refuse(event.channel, RequestError(ErrorCode.BUSY, "full"))
    return out


def ready(hello: bytes = MULTIPLEX, *channels: int) -> ServerConnection:
    core = ServerConnection()
    events(core, hello + b"".join(ctrl(ch, Open(argv=["cat"], pty=False)) for ch in channels))
    core.data_to_send()
    return core


def test_hello_then_pipelined_open_and_stdin() -> None:
    core = ServerConnection()
    core.receive_data(HELLO + ctrl(1, Open(argv=["cat"])) + encode_frame(FrameKind.STDIN, 1, b"hi"))
    assert isinstance(core.next_event(), HelloReceived)
    with pytest.raises(LocalProtocolError, match="accept_hello"):
        core.next_event()  # the decision on the hello comes first
    core.accept_hello("test")
    assert isinstance(core.next_event(), OpenRequested)
    with pytest.raises(LocalProtocolError, match="opened"):
        core.next_event()  # answers keep request order: the open is answered first
    assert core.opened(1, Opened(pid=7))
    assert core.next_event() == StdinReceived(1, b"hi")
    assert [c for _, c in controls(core)] == [
        {"type": "welcome", "protocol": 1, "server": "test", "max_frame": 1 << 20},
        {"type": "opened", "pid": 7}]


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
    (HELLO + ctrl(1, b'["type"]'), "not a JSON object"),
    (HELLO + ctrl(1, b'{"type": "eof"} {}'), "not valid"),  # trailing bytes in a payload
    (HELLO + b"\x09" + bytes(8), "unknown frame kind"),
    (ctrl(0, {"type": "hello", "protocol": "1"}), "integer member 'protocol'"),
    (ctrl(0, {"type": "hello", "protocol": 1, "window": "big"}), "window"),
])
def test_protocol_errors_answer_on_channel_0_and_close(data: bytes, match: str) -> None:
    core = ServerConnection()
    with pytest.raises(RemoteProtocolError, match=match) as info:
        events(core, data)
    assert info.value.code is ErrorCode.PROTOCOL_ERROR
    answers = controls(core)
    assert answers[-1][0] == 0 and answers[-1][1]["code"] == "protocol_error"
    assert core.closing
    core.receive_data(HELLO)  # nothing more is read
    assert core.next_event() is None and not core.pending


def test_frames_before_a_protocol_error_are_acted_on() -> None:
    core = ServerConnection()
    core.receive_data(MULTIPLEX + ctrl(1, Open()) + b"\x09" + bytes(8))
    assert isinstance(core.next_event(), HelloReceived)
    core.accept_hello("t")
    assert isinstance(core.next_event(), OpenRequested)
    core.opened(1, Opened(pid=5))
    with pytest.raises(RemoteProtocolError):
        core.next_event()


def test_unsupported_protocol_version() -> None:
    core = ServerConnection()
    with pytest.raises(RemoteProtocolError) as info:
        events(core, ctrl(0, Hello(protocol=2)))
    assert info.value.code is ErrorCode.UNSUPPORTED_PROTOCOL
    assert controls(core)[0][1]["code"] == "unsupported_protocol"


def test_closing_the_hello_refuses_it_and_reads_nothing_more() -> None:
    core = ServerConnection()
    core.receive_data(HELLO + ctrl(1, Open()))
    assert isinstance(core.next_event(), HelloReceived)
    core.close(RequestError(ErrorCode.UNAUTHORIZED, "no"))
    assert core.next_event() is None  # the pipelined open is discarded
    assert controls(core) == [(0, {"type": "error", "code": "unauthorized", "message": "no",
                                   "retriable": False})]


def test_unknown_message_answers_on_its_channel_and_goes_on() -> None:
    core = ready(MULTIPLEX, 1)
    assert events(core, ctrl(1, {"type": "dance"}) + ctrl(0, {"type": "x"})
                  + ctrl(9, {"type": "y"}) + ctrl(1, Resize(rows=2, cols=3))) == [
        ControlReceived(1, Resize(rows=2, cols=3))]
    assert [(ch, c["code"]) for ch, c in controls(core)] == [
        (1, "unknown_message"), (0, "unknown_message"), (9, "unknown_message")]


def test_bad_control_members_answer_bad_request_and_the_session_goes_on() -> None:
    core = ready(MULTIPLEX, 1)
    got = events(core, ctrl(1, {"type": "signal", "name": "NOPE"})
                 + ctrl(1, Resize(rows=3, cols=4)))
    assert got == [ControlReceived(1, Resize(rows=3, cols=4))]
    assert controls(core)[0][1]["code"] == "bad_request"
    assert core.channels.state(1) is ChannelState.OPEN


def test_a_bad_open_ends_its_channel_and_later_frames_are_discarded() -> None:
    core = ready(MULTIPLEX)
    assert events(core, ctrl(3, {"type": "open", "rows": 0})) == []
    (channel, reply), = controls(core)
    assert channel == 3 and reply["code"] == "bad_request" and "rows" in str(reply["message"])
    late = encode_frame(FrameKind.STDIN, 3, b"x") + ctrl(3, {"type": "eof"})
    assert events(core, late) == [] and not core.pending
    assert not core.closing  # a multiplexed connection goes on


def test_single_session_a_refused_open_closes_the_connection() -> None:
    core = ServerConnection()
    events(core, HELLO + ctrl(1, Open()), admit=False)
    assert [c.get("type") for _, c in controls(core)] == ["welcome", "error"]
    assert core.closing


def test_single_session_a_second_open_is_a_bad_request_and_the_first_goes_on() -> None:
    core = ready(HELLO, 1)
    assert events(core, ctrl(2, Open())) == []
    assert controls(core) == [(2, {"type": "error", "code": "bad_request", "retriable": False,
                                   "message": "this connection carries one session "
                                              "(hello.multiplex is false)"})]
    assert core.channels.state(1) is ChannelState.OPEN and not core.closing
    assert core.send_exit(1, Exit(code=0))
    assert core.closing  # the session's last frame ends a single-session connection
    assert events(core, encode_frame(FrameKind.STDIN, 1, b"late")) == []


def test_channel_in_use_on_the_channel_while_live_on_channel_0_once_ended() -> None:
    core = ready(MULTIPLEX, 1)
    events(core, ctrl(1, Open()))
    assert controls(core) == [(1, {"type": "error", "code": "channel_in_use",
                                   "message": "channel 1 is in use", "retriable": False})]
    core.send_exit(1, Exit(code=0))
    core.data_to_send()
    events(core, ctrl(1, Open()))
    assert controls(core) == [(0, {"type": "error", "code": "channel_in_use", "channel": 1,
                                   "message": "channel 1 was already used",
                                   "retriable": False})]


def test_cancel_ends_the_channel_and_nothing_is_framed_after() -> None:
    core = ready(MULTIPLEX, 1)
    assert events(core, ctrl(1, {"type": "cancel"})) == [CancelRequested(1)]
    assert events(core, encode_frame(FrameKind.STDIN, 1, b"late")) == []
    assert core.send_output(1, FrameKind.STDOUT, b"late") is False
    assert core.send_exit(1, Exit(code=0)) is False
    assert core.refuse(1, RequestError(ErrorCode.BAD_REQUEST, "x")) is False
    assert not core.pending


def test_exit_is_the_last_frame_of_its_channel() -> None:
    core = ready(MULTIPLEX, 1)
    assert core.send_output(1, FrameKind.STDOUT, b"out")
    assert core.send_exit(1, Exit(code=3))
    assert core.send_output(1, FrameKind.STDOUT, b"more") is False
    assert core.send_exit(1, Exit(code=4)) is False
    core.stdin_consumed(1, 10)
    frames = sent(core)
    assert [(f.kind, f.payload) for f in frames] == [
        (FrameKind.STDOUT, b"out"), (FrameKind.CTRL_OUT, b'{"type":"exit","code":3}')]
    assert events(core, encode_frame(FrameKind.STDIN, 1, b"late")) == []


def test_what_the_protocol_forbids_is_refused_locally() -> None:
    core = ServerConnection()
    events(core, MULTIPLEX)
    core.receive_data(ctrl(1, Open(pty=True)))
    assert isinstance(core.next_event(), OpenRequested)
    with pytest.raises(LocalProtocolError, match="not open"):
        core.send_output(1, FrameKind.STDOUT, b"before opened")
    with pytest.raises(LocalProtocolError, match="not allowed"):
        core.send_exit(1, Exit(code=0))
    core.opened(1, Opened(pid=5))
    with pytest.raises(LocalProtocolError, match="STDERR"):
        core.send_output(1, FrameKind.STDERR, b"a PTY has no stderr")
    with pytest.raises(LocalProtocolError, match="never opened"):
        core.send_exit(2, Exit(code=0))
    with pytest.raises(LocalProtocolError, match="close"):
        core.refuse(0, RequestError(ErrorCode.BUSY, "x"))


def test_output_credit_is_spent_granted_and_never_overdrawn() -> None:
    core = ready(WINDOWED, 1)
    assert core.output_credit(1) == 100
    assert core.send_output(1, FrameKind.STDOUT, b"x" * 60)
    assert core.output_credit(1) == 40
    with pytest.raises(LocalProtocolError, match="exceed its credit"):
        core.send_output(1, FrameKind.STDERR, b"y" * 41)  # STDOUT and STDERR share it
    assert events(core, ctrl(1, Window(bytes=10))) == [CreditGranted(1, 10)]
    assert core.output_credit(1) == 50
    core.send_output(1, FrameKind.STDERR, b"y" * 50)
    assert core.output_credit(1) == 0
    assert core.send_exit(1, Exit(code=0))  # exit needs no credit
    assert core.output_credit(1) == 0


@pytest.mark.parametrize("value", ["10", 1.5, -1, 0, None, True, 1 << 31, [1]])
def test_window_bytes_is_validated_strictly_and_the_session_goes_on(value: object) -> None:
    core = ready(WINDOWED, 1)
    payload = json.dumps({"type": "window", "bytes": value}).encode()
    assert events(core, ctrl(1, payload)) == []
    (channel, reply), = controls(core)
    assert (channel, reply["code"]) == (1, "bad_request")
    assert core.output_credit(1) == 100  # no credit added
    assert events(core, ctrl(1, Window(bytes=(1 << 31) - 1))) == [CreditGranted(1, (1 << 31) - 1)]
    assert core.output_credit(1) == 100 + (1 << 31) - 1


def test_stdin_window_is_offered_spent_and_granted_back() -> None:
    core = ServerConnection(stdin_window=64)
    events(core, WINDOWED)
    assert controls(core)[0][1]["window"] == 64
    events(core, ctrl(1, Open()))
    core.data_to_send()
    stdin = encode_frame(FrameKind.STDIN, 1, b"a" * 40)
    assert events(core, stdin) == [StdinReceived(1, b"a" * 40)]
    core.stdin_consumed(1, 31)
    assert not core.pending  # less than half the window: nothing to say yet
    core.stdin_consumed(1, 1)
    assert controls(core) == [(1, {"type": "window", "bytes": 32})]
    events(core, encode_frame(FrameKind.STDIN, 1, b"b" * 56))  # 64 - 40 + 32 = 56 left
    with pytest.raises(RemoteProtocolError, match="beyond the window"):
        events(core, encode_frame(FrameKind.STDIN, 1, b"c"))


def test_without_windows_there_is_no_credit_either_way() -> None:
    core = ServerConnection()
    events(core, MULTIPLEX)
    assert "window" not in controls(core)[0][1]
    events(core, ctrl(1, Open(pty=False)))
    core.data_to_send()
    assert core.output_credit(1) is None
    assert core.send_output(1, FrameKind.STDOUT, b"x" * 5000)
    assert events(core, encode_frame(FrameKind.STDIN, 1, b"y" * 5000) + ctrl(1, Window(bytes=1))
                  ) == [StdinReceived(1, b"y" * 5000)]
    core.stdin_consumed(1, 5000)
    assert [f.kind for f in sent(core)] == [FrameKind.STDOUT]


def test_answers_keep_the_order_of_the_requests() -> None:
    core = ready(MULTIPLEX, 1)
    batch = (ctrl(1, {"type": "nope"}) + ctrl(2, Open()) + ctrl(1, {"type": "signal"})
             + ctrl(3, Open()) + ctrl(2, {"type": "what"}) + ctrl(1, Open()))
    core.receive_data(batch)
    while (event := core.next_event()) is not None:
        if isinstance(event, OpenRequested):
            if event.channel == 2:
                core.refuse(2, RequestError(ErrorCode.FORBIDDEN, "not this"))
            else:
                core.opened(event.channel, Opened(pid=9))
    assert [(ch, c["type"], c.get("code")) for ch, c in controls(core)] == [
        (1, "error", "unknown_message"), (2, "error", "forbidden"), (1, "error", "bad_request"),
        (3, "opened", None), (1, "error", "channel_in_use")]  # channel 2 ended: discarded


def test_handshake_is_done_after_hello_and_for_one_session_its_open() -> None:
    single = ServerConnection()
    events(single, HELLO)
    assert not single.handshake_done
    events(single, ctrl(1, Open()))
    assert single.handshake_done
    multi = ServerConnection()
    assert not multi.handshake_done
    events(multi, MULTIPLEX)
    assert multi.handshake_done


def client_stream() -> bytes:
    return (WINDOWED + ctrl(1, Open(argv=["sh"], env={"A": "b"})) + encode_frame(
        FrameKind.STDIN, 1, b"data") + ctrl(1, Resize(rows=5, cols=6)) + ctrl(1, Window(bytes=7))
            + ctrl(1, {"type": "signal", "name": "INT", "extra": [1, {"x": 2}]})
            + ctrl(1, {"type": "eof"}) + ctrl(1, {"type": "cancel"}))


def test_control_messages_parse_the_same_whole_byte_by_byte_and_split() -> None:
    stream = client_stream()
    whole = events(ServerConnection(), stream)
    assert [type(e).__name__ for e in whole] == [
        "HelloReceived", "OpenRequested", "StdinReceived", "ControlReceived", "CreditGranted",
        "ControlReceived", "ControlReceived", "CancelRequested"]
    core = ServerConnection()
    assert [e for i in range(len(stream)) for e in events(core, stream[i:i + 1])] == whole
    rng = random.Random(7)
    for _ in range(50):
        core = ServerConnection()
        cuts = sorted(rng.sample(range(1, len(stream)), 6))
        pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
        assert [e for piece in pieces for e in events(core, piece)] == whole


def test_trailing_bytes_wait_for_the_rest_of_their_frame() -> None:
    core = ServerConnection()
    next_frame = ctrl(1, Resize(rows=9, cols=9))
    got = events(core, client_stream()[:-len(ctrl(1, {"type": "cancel"}))] + next_frame[:5])
    assert not any(isinstance(e, CancelRequested) for e in got)
    assert events(core, next_frame[5:]) == [ControlReceived(1, Resize(rows=9, cols=9))]


def test_memory_for_ended_ids_stays_bounded() -> None:
    core = ready(MULTIPLEX)
    for channel in range(1, 20_001):
        events(core, ctrl(channel, Open()))
        core.send_exit(channel, Exit(code=0))
        core.data_to_send()
    assert core.channels.live == {} and len(core.channels.used) == 1
    rng = random.Random(1)
    for channel in rng.sample(range(30_000, 10_000_000), 5000):  # ids in any order
        events(core, ctrl(channel, Open()))
        core.send_exit(channel, Exit(code=0))
    assert core.channels.live == {} and len(core.channels.used) <= core.channels.used.max_ranges
    core.data_to_send()
    events(core, ctrl(20_000, Open()))  # an ended id is still refused as reused
    assert controls(core)[0][1]["channel"] == 20_000


# --- section 11: observers and grants ------------------------------------------------


def _observed(window: bool = False) -> ServerConnection:
    """A connection whose channel 1 is attached as an observer."""
    core = ServerConnection()
    core.receive_data((WINDOWED if window else MULTIPLEX)
                      + ctrl(1, {"type": "attach", "session": "s1", "role": "observer"}))
    assert isinstance(core.next_event(), HelloReceived)
    core.accept_hello("test")
    event = core.next_event()
    assert isinstance(event, AttachRequested) and event.request.role == "observer"
    core.attached(1, Attached(session="s1", pid=1, pty=False, dropped=0, role="observer"))
    core.data_to_send()
    return core


def test_an_observers_stdin_is_dropped_and_spends_no_credit() -> None:
    core = _observed(window=True)
    assert events(core, encode_frame(FrameKind.STDIN, 1, b"x" * 500)) == []  # 5x its window
    assert controls(core) == []  # without a word, and no protocol error
    assert not core.closing


@pytest.mark.parametrize("message", [{"type": "resize", "rows": 5, "cols": 5},
                                     {"type": "signal", "name": "INT"}, {"type": "eof"},
                                     {"type": "cancel"}])
def test_writer_only_messages_from_an_observer_are_read_only(message: dict[str, object],
                                                             ) -> None:
    core = _observed()
    assert events(core, ctrl(1, message)) == []
    ((channel, refused),) = controls(core)
    assert channel == 1 and refused["code"] == "read_only" and not core.closing
    assert core.channels.state(1) is ChannelState.OPEN  # the channel goes on
    assert [type(e) for e in events(core, ctrl(1, {"type": "detach"}))] == [DetachRequested]


def _granted(role: str = "observer") -> ServerConnection:
    core = ServerConnection()
    core.receive_data(ctrl(0, Hello(protocol=1, multiplex=True, grant="gsecret")))
    assert isinstance(core.next_event(), HelloReceived)
    core.accept_hello("test", GrantScope(session="s1", role=role,  # type: ignore[arg-type]
                                         expires="2026-12-02T00:00:00.000Z"))
    ((_, welcome),) = controls(core)
    assert welcome["grant"] == {"session": "s1", "role": role,
                                "expires": "2026-12-02T00:00:00.000Z"}
    return core


@pytest.mark.parametrize(("channel", "request_"), [
    (1, {"type": "open"}), (2, {"type": "attach", "session": "s2", "role": "observer"}),
    (3, {"type": "attach", "session": "s1"})])
def test_a_grants_connection_attaches_its_session_in_its_role_only(
        channel: int, request_: dict[str, object]) -> None:
    core = _granted()
    assert events(core, ctrl(channel, request_)) == []
    ((on, refused),) = controls(core)
    assert on == channel and refused["code"] == "forbidden"
    core.receive_data(ctrl(9, {"type": "attach", "session": "s1", "role": "observer"}))
    assert isinstance(core.next_event(), AttachRequested)  # what it may do, it may


@pytest.mark.parametrize("request_", [{"type": "list"}, {"type": "unshare", "grant": "g"},
                                      {"type": "share", "session": "s1", "ttl": 5}])
def test_a_grants_connection_may_not_list_share_or_unshare(request_: dict[str, object],
                                                          ) -> None:
    core = _granted("writer")
    assert events(core, ctrl(0, request_)) == []
    ((channel, refused),) = controls(core)
    assert channel == 0 and refused["code"] == "forbidden" and not core.closing


def test_only_a_writer_grant_releases_and_only_its_session() -> None:
    release = ctrl(0, {"type": "release", "session": "s1"})
    assert events(_granted("observer"), release) == []  # ignored: not the owner's exit
    assert [type(e) for e in events(_granted("writer"), release)] == [ReleaseRequested]
    other = _granted("writer")
    assert events(other, ctrl(0, {"type": "release", "session": "s2"})) == []


def test_share_refused_on_channel_0_goes_on() -> None:
    core = ready()
    assert events(core, ctrl(0, {"type": "share", "session": "s1", "ttl": 0})) == []
    ((channel, refused),) = controls(core)
    assert channel == 0 and refused["code"] == "bad_request" and not core.closing
    (event,) = events(core, ctrl(0, {"type": "share", "session": "s1"}))
    assert isinstance(event, ShareRequested) and event.request.ttl is None
