"""`serve --stdio --persist`: the far side of a carrier whose sessions must outlive it.

A plain `serve --stdio` is the server of one connection: its sessions end with the ssh
that started it. With `--persist` this process serves nothing itself. It relays its
stdin and stdout, byte for byte, to the user's own server on the default Unix socket,
and starts that server in the background (in a session of its own, so the ssh login's
end does not hang it up) when none answers. Every reconnect runs ssh again, and reaches
the same server and the same sessions.

No event loop: a relay of two byte streams needs poll(2) and two bounded buffers, and a
carrier's far side should start as fast as Python can.
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import socket
import subprocess
import sys
import time

from ..addresses import default_address
from ..exitcodes import ServeExit

STDIN, STDOUT = 0, 1  # the carrier's two ends, relayed
RELAY_READ = 64 * 1024  # one read of either side
START_WAIT = 10.0  # seconds a server started here has to answer on its socket
_ABSENT = frozenset({errno.ENOENT, errno.ECONNREFUSED})  # nobody answers there (yet)


def persist_main() -> int:
    """Relay stdin and stdout to the user's server, starting it when none answers."""
    address = default_address()
    path = address.path
    try:
        sock = _connect(path)
        if sock is None:
            _start_server(path)
            sock = _await_server(path)
    except OSError as exc:
        sys.stderr.write(f"ttyserve serve --persist: {path}: {exc.strerror or exc}\n")
        return ServeExit.CONFIG
    with sock:
        _relay(sock)
    return ServeExit.OK


def _connect(path: str) -> socket.socket | None:
    """A connection to the server at ``path``; None when nobody answers there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        if exc.errno in _ABSENT:
            return None
        raise
    return sock


def _start_server(path: str) -> None:
    """`ttyserve serve` on the default socket, in a session of its own, its stderr in a log
    file beside the socket. Two relays that start one at once are fine: the socket's lease
    lets one of them serve, and the other exits 4."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    log_path = os.path.join(directory, "ttyserve.log")
    with open(log_path, "ab") as log:
        os.chmod(log_path, 0o600)
        subprocess.Popen([sys.executable, "-m", "ttyserve", "serve"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
                         close_fds=True)


def _await_server(path: str) -> socket.socket:
    """The server just started answers within START_WAIT (it takes a few tens of ms)."""
    deadline = time.monotonic() + START_WAIT
    delay = 0.005
    while True:
        sock = _connect(path)
        if sock is not None:
            return sock
        if time.monotonic() >= deadline:
            raise OSError(errno.ETIMEDOUT, f"the server started here did not answer within "
                                           f"{START_WAIT:g} s (see ttyserve.log beside it)")
        time.sleep(delay)  # a socket that does not exist yet has no event to wait for
        delay = min(delay * 2, 0.1)


def _relay(sock: socket.socket) -> None:
    """Bytes both ways until either side ends: stdin to the server, the server to stdout.
    Each direction holds one read at most, so neither side can grow our memory, and a
    direction that waits never stops the other."""
    sock.setblocking(False)
    os.set_blocking(STDIN, False)
    os.set_blocking(STDOUT, False)
    up = b""  # read from stdin, not yet sent to the server
    down = b""  # read from the server, not yet written to stdout
    up_open = down_open = True
    with selectors.DefaultSelector() as selector:
        while down_open or down:  # (what the server still sends after our stdin's end goes)
            events = _interest(sock.fileno(), up, down, up_open, down_open)
            for fd, mask in events.items():
                selector.register(fd, mask)
            ready = selector.select()
            for fd in events:
                selector.unregister(fd)
            for key, mask in ready:
                fd = key.fd
                try:
                    if fd == STDIN and mask & selectors.EVENT_READ:
                        up = os.read(STDIN, RELAY_READ)
                        if not up:
                            up_open = False
                            with contextlib.suppress(OSError):
                                sock.shutdown(socket.SHUT_WR)
                    if fd == sock.fileno() and mask & selectors.EVENT_WRITE and up:
                        up = up[sock.send(up):]
                    if fd == sock.fileno() and mask & selectors.EVENT_READ and not down:
                        down = sock.recv(RELAY_READ)
                        if not down:
                            down_open = False
                    if fd == STDOUT and mask & selectors.EVENT_WRITE and down:
                        down = down[os.write(STDOUT, down):]
                except BlockingIOError:
                    continue
                except OSError:
                    return  # either side broke: the connection is over, the sessions go on


def _interest(sock: int, up: bytes, down: bytes, up_open: bool, down_open: bool) -> dict[int, int]:
    """What each descriptor is waited for: a direction holding a read waits to write it,
    else to read again (stdin only while the server still sends)."""
    events: dict[int, int] = {}
    if up:
        events[sock] = selectors.EVENT_WRITE
    elif up_open and down_open:
        events[STDIN] = selectors.EVENT_READ
    if down:
        events[STDOUT] = selectors.EVENT_WRITE
    elif down_open:
        events[sock] = events.get(sock, 0) | selectors.EVENT_READ
    return events
