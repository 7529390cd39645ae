"""Accepting connections, one rule for the single process and the supervisor alike: a batch at
each readiness (then other work has a turn), a connection whose accept failed skipped, and a
pause when the process is out of descriptors or memory (accept would fail at once again)."""

from __future__ import annotations

import errno
import logging
import socket

import anyio

log = logging.getLogger("ttyserve")

ACCEPT_BATCH = 16  # connections accepted at one readiness, before others have a turn
ACCEPT_RETRY = 0.1  # seconds: the pause when accept() fails for lack of descriptors
STARVED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class Acceptor:
    """One listening socket's accepting."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.starved: OSError | None = None  # why the last batch stopped early

    def accept_batch(self) -> list[socket.socket]:
        """What is waiting, ACCEPT_BATCH at most (never blocks); stops early when starved."""
        accepted: list[socket.socket] = []
        for _ in range(ACCEPT_BATCH):  # (tries, not successes: a failure that repeats ends it)
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno in STARVED:
                    self.starved = exc
                    break
                continue  # (that one connection failed: the next may not)
            accepted.append(sock)
        return accepted

    async def pause_if_starved(self) -> None:
        """After a batch that ran out of descriptors: say so, and wait before the next."""
        if self.starved is not None:
            log.warning("accept failed: %s; retrying", self.starved.strerror)
            self.starved = None
            await anyio.sleep(ACCEPT_RETRY)
