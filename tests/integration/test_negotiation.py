"""Acceptance 6: every refusal carries its contract code, and the server survives it."""

from __future__ import annotations

import errno

import pytest
from helpers import HELLO, ServerProcess, ctrl, raw_peer, split_output

from ttyserve.client import run
from ttyserve.protocol.frames import FrameKind, encode_frame
from ttyserve.protocol.messages import Hello, Open

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]


async def exchange(address: str, data: bytes) -> list[tuple[int, dict[str, object]]]:
    """Send ``data``; return every control message until the server closes."""
    async with raw_peer(address) as peer:
        await peer.send(data)
        frames = await peer.frames_until_eof()
    return [(f.channel, c) for f in frames for c in split_output([f], f.channel)[2]]


async def assert_still_serves(address: str) -> None:
    result = await run(["echo", "alive"], address=address)
    assert (result.status.code, result.stdout) == (0, b"alive\n")


@pytest.mark.parametrize("pty", [False, True], ids=["pipe", "pty"])
async def test_spawn_failure_enoent(server_process: ServerProcess, pty: bool) -> None:
    address = server_process.addresses[0]
    replies = await exchange(address, HELLO + ctrl(1, Open(argv=["no-such-cmd"], pty=pty)))
    assert replies[0][1]["type"] == "welcome"
    channel, error = replies[1]
    assert channel == 1
    assert (error["code"], error["errno"], error["retriable"]) == (
        "spawn_failed", errno.ENOENT, False)
    assert len(replies) == 2  # the channel is finished and the connection closed
    await assert_still_serves(address)


@pytest.mark.parametrize("members, field", [
    ({"rows": 0}, "rows"), ({"cols": 20000}, "cols"), ({"argv": "sh"}, "argv"),
    ({"env": {"A": 1}}, "env"),
])
async def test_bad_open_members(server_process: ServerProcess, members: dict[str, object],
                                field: str) -> None:
    replies = await exchange(server_process.addresses[0],
                             HELLO + ctrl(1, {"type": "open", **members}))
    channel, error = replies[1]
    assert (channel, error["code"]) == (1, "bad_request")
    assert field in str(error["message"])


async def test_unknown_protocol_version(server_process: ServerProcess) -> None:
    replies = await exchange(server_process.addresses[0],
                             ctrl(0, Hello(protocol=99)) + ctrl(1, Open(argv=["true"])))
    assert replies == [(0, replies[0][1])]
    assert replies[0][1]["code"] == "unsupported_protocol"  # the pipelined open is discarded


async def test_unknown_message_type_goes_on(server_process: ServerProcess) -> None:
    replies = await exchange(server_process.addresses[0], HELLO + ctrl(0, {"type": "dance"})
                             + ctrl(1, Open(argv=["echo", "x"], pty=False)))
    codes = [(ch, m["type"], m["code"] if m["type"] == "error" else None) for ch, m in replies]
    assert codes == [(0, "welcome", None), (0, "error", "unknown_message"),
                     (1, "opened", None), (1, "exit", None)]


@pytest.mark.parametrize("data", [
    HELLO + ctrl(1, b"{not json"),
    HELLO + ctrl(1, b'["an", "array"]'),
    HELLO + encode_frame(FrameKind.STDOUT, 1, b"wrong direction"),
    HELLO + b"\x07" + bytes(8),
    HELLO + encode_frame(FrameKind.STDIN, 9, b"never opened"),
    ctrl(1, Open()),
    HELLO + HELLO,
], ids=["bad-json", "not-object", "direction", "unknown-kind", "unopened", "no-hello",
        "second-hello"])
async def test_malformed_input_is_protocol_error_and_close(server_process: ServerProcess,
                                                            data: bytes) -> None:
    replies = await exchange(server_process.addresses[0], data)
    assert replies[-1][0] == 0
    assert replies[-1][1]["code"] == "protocol_error"
    await assert_still_serves(server_process.addresses[0])


async def test_oversize_frame(server_process: ServerProcess) -> None:
    header = bytes([FrameKind.STDIN]) + (1).to_bytes(4, "big") + (2 << 20).to_bytes(4, "big")
    replies = await exchange(server_process.addresses[0],
                             HELLO + ctrl(1, Open(argv=["cat"], pty=False)) + header)
    assert replies[-1] == (0, replies[-1][1])
    assert replies[-1][1]["code"] == "protocol_error"
    assert "max_frame" in str(replies[-1][1]["message"])
    await assert_still_serves(server_process.addresses[0])


async def test_second_open_on_a_single_session_connection(server_process: ServerProcess) -> None:
    replies = await exchange(server_process.addresses[0], HELLO
                             + ctrl(1, Open(argv=["sh", "-c", "read x"], pty=False))
                             + ctrl(2, Open(argv=["true"]))
                             + encode_frame(FrameKind.STDIN, 1, b"go\n"))
    assert (2, "bad_request") in [(ch, m.get("code")) for ch, m in replies]
    assert replies[-1] == (1, {"type": "exit", "code": 0})
