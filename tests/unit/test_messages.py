"""Control messages: every one round-trips; malformed payloads map to their error codes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ttyserve.errors import ErrorCode, RequestError
from ttyserve.errors import RemoteProtocolError as ProtocolError
from ttyserve.protocol.messages import (
    CLIENT_MESSAGES,
    SERVER_MESSAGES,
    Cancel,
    Eof,
    Error,
    Exit,
    Hello,
    Message,
    Open,
    Opened,
    Resize,
    Signal,
    Welcome,
    Window,
    convert_message,
    encode_message,
    parse_object,
)

EXAMPLES: list[Message] = [
    Hello(protocol=1, token="t", client="c/1", multiplex=True, window=65536),
    Open(argv=["bash", "-l"], pty=False, rows=50, cols=132, term="vt100", env={"A": "b"}, cwd="/"),
    Resize(rows=1, cols=10000),
    Signal(name="INT"),
    Eof(),
    Cancel(),
    Window(bytes=4096),
    Welcome(protocol=1, server="ttyserve/0.1.0", max_frame=1 << 20),
    Opened(pid=1234),
    Exit(code=0),
    Exit(code=-9, signal="KILL", core_dumped=False),
    Exit(code=-1, error="waitpid failed: x"),
    Error(code="spawn_failed", message="m", errno=2, retriable=False, retry_after_ms=5),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(message: Message) -> None:
    kind, obj = parse_object(encode_message(message))
    vocabulary = CLIENT_MESSAGES if kind in CLIENT_MESSAGES else SERVER_MESSAGES
    assert convert_message(kind, obj, vocabulary) == message


def test_defaults_of_open() -> None:
    request = convert_message("open", {"type": "open"}, CLIENT_MESSAGES)
    assert request == Open(argv=[], pty=True, rows=24, cols=80, term="xterm-256color", env={},
                           cwd=None)


def test_exit_wire_form_omits_what_does_not_apply() -> None:
    assert encode_message(Exit(code=0)) == b'{"type":"exit","code":0}'
    assert b'"core_dumped":false' in encode_message(Exit(code=-9, signal="KILL", core_dumped=False))


def test_unknown_members_are_ignored() -> None:
    msg = convert_message("resize", {"type": "resize", "rows": 2, "cols": 3, "x": [1]},
                          CLIENT_MESSAGES)
    assert msg == Resize(rows=2, cols=3)


@pytest.mark.parametrize("payload", [
    b"not json", b"[1,2]", b'{"no_type": 1}', b'{"type": 5}', b"\xff\xfe", b'"str"',
])
def test_not_an_object_with_a_string_type(payload: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_object(payload)


def test_deep_nesting_is_a_protocol_error_not_a_crash() -> None:
    with pytest.raises(ProtocolError):
        parse_object(b"[" * 100000 + b"]" * 100000)


@pytest.mark.parametrize("obj", [
    {"type": "open", "rows": 0},
    {"type": "open", "cols": 10001},
    {"type": "open", "argv": "ls"},
    {"type": "open", "pty": "yes"},
    {"type": "open", "env": {"A": 1}},
    {"type": "signal", "name": "NOPE"},
    {"type": "resize", "rows": 5},
])
def test_bad_members_are_bad_request(obj: dict[str, object]) -> None:
    with pytest.raises(RequestError) as info:
        convert_message(str(obj["type"]), obj, CLIENT_MESSAGES)
    assert info.value.code is ErrorCode.BAD_REQUEST


def test_unknown_type_is_unknown_message() -> None:
    with pytest.raises(RequestError) as info:
        convert_message("dance", {"type": "dance"}, CLIENT_MESSAGES)
    assert info.value.code is ErrorCode.UNKNOWN_MESSAGE


@given(st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=5))
def test_arbitrary_open_objects_decode_or_are_refused(obj: dict[str, object]) -> None:
    obj["type"] = "open"
    try:
        convert_message("open", obj, CLIENT_MESSAGES)
    except RequestError as exc:
        assert exc.code is ErrorCode.BAD_REQUEST
