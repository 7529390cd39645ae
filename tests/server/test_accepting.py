"""The one accept rule (server/accepting.py), on real sockets in this process: a batch at a
time, and out of descriptors, a stop and a pause rather than a spin, with what waits in the
backlog accepted afterwards."""

from __future__ import annotations

import os
import resource
import socket

import anyio
import pytest

from ttyserve.server.accepting import ACCEPT_BATCH, ACCEPT_RETRY, Acceptor


def listening() -> socket.socket:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind("")  # (an abstract address: no file)
    listener.listen(64)
    listener.setblocking(False)
    return listener


def test_a_batch_is_at_most_accept_batch() -> None:
    with listening() as listener:
        address = listener.getsockname()
        clients = [socket.socket(socket.AF_UNIX) for _ in range(ACCEPT_BATCH + 3)]
        for client in clients:
            client.connect(address)
        acceptor = Acceptor(listener)
        first, second = acceptor.accept_batch(), acceptor.accept_batch()
        assert (len(first), len(second), acceptor.starved) == (ACCEPT_BATCH, 3, None)
        for sock in [*first, *second, *clients]:
            sock.close()


@pytest.mark.asyncio
@pytest.mark.timeout(10)
async def test_out_of_descriptors_it_stops_pauses_and_then_accepts() -> None:
    with listening() as listener, socket.socket(socket.AF_UNIX) as client:
        client.connect(listener.getsockname())
        acceptor = Acceptor(listener)
        saved = resource.getrlimit(resource.RLIMIT_NOFILE)
        lowest_free = os.dup(0)  # every descriptor below it is taken: none may be made
        os.close(lowest_free)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, saved[1]))
        try:
            assert acceptor.accept_batch() == []
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, saved)
        assert acceptor.starved is not None and acceptor.starved.strerror
        started = anyio.current_time()
        await acceptor.pause_if_starved()
        assert anyio.current_time() - started >= ACCEPT_RETRY * 0.9
        assert acceptor.starved is None
        (accepted,) = acceptor.accept_batch()  # it waited in the backlog
        accepted.close()
