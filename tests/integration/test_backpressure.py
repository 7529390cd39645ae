"""Acceptance 8: a client that stops reading does not grow the server's memory."""

from __future__ import annotations

import socket
import time

import pytest
from helpers import HELLO, ServerProcess, blocking_unix_socket, ctrl, rss_kib

from ttyserve.protocol.messages import Open

pytestmark = pytest.mark.timeout(60)
STALL_SECONDS = 10
RSS_GROWTH_LIMIT_KIB = 8 * 1024  # one write queue and a few reads is well under this


@pytest.mark.parametrize("pty", [False, True], ids=["pipe", "pty"])
def test_stalled_reader_keeps_server_memory_flat(server_process: ServerProcess,
                                                 pty: bool) -> None:
    path = server_process.addresses[0].removeprefix("unix:")
    with blocking_unix_socket(path) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(HELLO + ctrl(1, Open(argv=["yes", "y" * 200], pty=pty)))
        sock.recv(4096)  # the welcome and the first output: the session is running
        time.sleep(1)  # let the pipeline fill up to its bounds
        before = rss_kib(server_process.pid)
        time.sleep(STALL_SECONDS - 1)  # the point of the test: time passes, nobody reads
        after = rss_kib(server_process.pid)
    assert after - before < RSS_GROWTH_LIMIT_KIB, (before, after)
