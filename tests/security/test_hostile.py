"""Hardening acceptance 3: idle floods, fuzzed frames and malformed messages do not hurt.

After each attack the server answers the next good client normally, and its
descriptors, children and memory are back where they were.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import (
    HELLO,
    ServerProcess,
    ctrl,
    start_server,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ttyserve.protocol.frames import FrameKind, encode_frame
from ttyserve.protocol.messages import Open, Resize, Signal

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("workers")]
RSS_GROWTH_LIMIT_KIB = 16 * 1024


@pytest.fixture
def server(short_dir: Path) -> Iterator[ServerProcess]:
    server = start_server(short_dir, "--handshake-timeout", "1", "--command", "/bin/sh")
    try:
        yield server
    finally:
        server.stop()


def path_of(server: ServerProcess) -> str:
    return server.addresses[0].removeprefix("unix:")


def good_client_works(server: ServerProcess) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(path_of(server))
        sock.sendall(HELLO + ctrl(1, Open(argv=["echo", "fine"], pty=False)))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert b"fine\n" in data and b'{"type":"exit","code":0}' in data


def send_and_close(server: ServerProcess, data: bytes, read: bool = True) -> bytes:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(path_of(server))
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            return b""
        received = b""
        if read:
            with contextlib.suppress(ConnectionResetError, TimeoutError):
                while chunk := sock.recv(65536):
                    received += chunk
        return received


class Footprint:
    """Descriptors, children and memory of the server, to compare before and after."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        good_client_works(server)  # warm up whatever the first session allocates
        self.fds = self.settle_fds(None)
        self.rss = server.rss_kib()

    def settle_fds(self, expected: int | None) -> int:
        deadline = time.monotonic() + 10
        count = self.server.open_fds()
        while (expected is None or count != expected) and time.monotonic() < deadline:
            time.sleep(0.05)  # connections close on the server's own schedule
            previous, count = count, self.server.open_fds()
            if expected is None and count == previous:
                break
        return count

    def check(self) -> None:
        good_client_works(self.server)
        assert self.settle_fds(self.fds) == self.fds
        deadline = time.monotonic() + 5
        while self.server.session_children() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.server.session_children() == []
        assert self.server.rss_kib() - self.rss < RSS_GROWTH_LIMIT_KIB


def test_a_thousand_silent_connections(server: ServerProcess) -> None:
    footprint = Footprint(server)
    sockets = []
    try:
        for _ in range(1000):
            sock = socket.socket(socket.AF_UNIX)
            sock.settimeout(10)
            sock.connect(path_of(server))
            sockets.append(sock)
        answers = []
        for sock in sockets:  # dropped after the handshake timeout, or refused as busy
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
            answers.append(json.loads(data[9:])["code"] if data else None)
    finally:
        for sock in sockets:
            sock.close()
    assert set(answers) <= {"busy", "protocol_error"}
    assert answers.count("busy") >= 1000 - 256
    footprint.check()


def mutate(rng: random.Random, frame: bytes) -> bytes:
    data = bytearray(frame)
    for _ in range(rng.randint(1, 4)):
        choice = rng.random()
        if choice < 0.4 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif choice < 0.6:
            del data[rng.randrange(len(data) + 1):]
        elif choice < 0.8:
            data[rng.randrange(len(data) + 1):0] = rng.randbytes(rng.randint(1, 16))
        else:
            data[0:1] = bytes([rng.randrange(8)])
    return bytes(data)


VALID = [
    ctrl(1, Open(argv=["cat"], pty=False)), ctrl(1, Open(argv=["true"])),
    encode_frame(FrameKind.STDIN, 1, b"hello\n"), ctrl(1, Resize(rows=5, cols=5)),
    ctrl(1, Signal(name="TERM")), ctrl(1, {"type": "eof"}), ctrl(1, {"type": "cancel"}),
    ctrl(0, {"type": "hello", "protocol": 1}), ctrl(2, {"type": "open", "argv": ["true"]}),
]


def test_ten_thousand_mutated_frames(server: ServerProcess) -> None:
    footprint = Footprint(server)
    rng = random.Random(20261130)
    sent = 0
    while sent < 10_000:
        frames = [HELLO] + [mutate(rng, rng.choice(VALID)) if rng.random() < 0.7
                            else rng.choice(VALID) for _ in range(50)]
        send_and_close(server, b"".join(frames), read=rng.random() < 0.5)
        sent += 50
    footprint.check()


@given(st.binary(max_size=512))
@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_bytes_after_hello(server: ServerProcess, garbage: bytes) -> None:
    send_and_close(server, HELLO + garbage, read=False)
    good_client_works(server)


@pytest.mark.parametrize("payload", [
    b"\xff\xfe\xfd not utf-8",
    b'{"type": "open", "argv": ["\xed\xa0\x80"]}',  # a lone surrogate, invalid UTF-8
    b"[" * 200_000 + b"]" * 200_000,
    b'{"type": "open", "env": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_001,
    b'{"type": "open", "argv": "' + b"x" * 900_000 + b'"}',
], ids=["invalid-utf8", "surrogate", "deep-array", "deep-object", "huge-string"])
def test_malformed_control_payloads(server: ServerProcess, payload: bytes) -> None:
    footprint = Footprint(server)
    answer = send_and_close(server, HELLO + ctrl(1, payload))
    assert b"protocol_error" in answer or b"bad_request" in answer
    footprint.check()


def test_oversize_and_truncated_frames(server: ServerProcess) -> None:
    footprint = Footprint(server)
    oversize = bytes([FrameKind.STDIN]) + (1).to_bytes(4, "big") + (64 << 20).to_bytes(4, "big")
    assert b"max_frame" in send_and_close(server, HELLO + oversize)
    truncated = encode_frame(FrameKind.CTRL_IN, 1, b'{"type": "open"}')[:-5]
    send_and_close(server, HELLO + truncated, read=False)
    send_and_close(server, HELLO[:4], read=False)
    footprint.check()
