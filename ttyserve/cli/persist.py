"""`serve --stdio --persist`: the far side of a carrier whose sessions must outlive it.

A plain `serve --stdio` is the server of one connection: its sessions end with the ssh
that started it. With `--persist` this process serves nothing itself. It relays its
stdin and stdout, byte for byte, to the user's own server on the default Unix socket,
and starts that server in the background (in a session of its own, so the ssh login's
end does not hang it up) when none answers. Every reconnect runs ssh again, and reaches
the same server and the same sessions.

No event loop: a relay of two byte streams needs poll(2) and two bounded buffers, and a
carrier's far side should start as fast as Python can. A reconnect (the carrier's exact
`serve --stdio --persist`, with a server answering) comes here from cli/__init__.py before
anything else is imported, so until it has to start a server this module imports only
modules built into the interpreter (`_socket` and `select`: `socket` and `selectors` would
import `enum` and more, a third of the relay's start).
"""

from __future__ import annotations

import _socket
import errno
import os
import select
import sys
import time

from ..runtime import default_socket_path

STDIN, STDOUT = 0, 1  # the carrier's two ends, relayed
RELAY_READ = 64 * 1024  # one read of either side
START_WAIT = 10.0  # seconds a server started here has to answer on its socket
_ABSENT = frozenset({errno.ENOENT, errno.ECONNREFUSED})  # nobody answers there (yet)


def relay_to_running_server() -> bool:
    """Relay stdin and stdout to the user's server if one answers on the default socket,
    until the connection is over; whether one answered. (The server running there has its
    own configuration: this relay reads none.) Raises OSError where the socket cannot be
    reached for another reason than nobody answering."""
    sock = _connect(default_socket_path())
    if sock is None:
        return False
    try:
        _relay(sock)
    finally:
        sock.close()
    return True


def persist_main() -> int:
    """Relay stdin and stdout to the user's server, starting it when none answers."""
    from ..exitcodes import ServeExit

    path = default_socket_path()
    try:
        sock = _connect(path)
        if sock is None:
            _start_server(path)
            sock = _await_server(path)
    except OSError as exc:
        sys.stderr.write(f"ttyserve serve --persist: {path}: {exc.strerror or exc}\n")
        return ServeExit.CONFIG
    try:
        _relay(sock)
    finally:
        sock.close()
    return ServeExit.OK


def _connect(path: str) -> _socket.socket | None:
    """A connection to the server at ``path``; None when nobody answers there."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
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
    import subprocess

    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    log_path = os.path.join(directory, "ttyserve.log")
    with open(log_path, "ab") as log:
        os.chmod(log_path, 0o600)
        subprocess.Popen([sys.executable, "-m", "ttyserve", "serve"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
                         close_fds=True)


def _await_server(path: str) -> _socket.socket:
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


def _relay(sock: _socket.socket) -> None:
    """Bytes both ways until either side ends: stdin to the server, the server to stdout.
    Each direction holds one read at most, so neither side can grow our memory, and a
    direction that waits never stops the other."""
    sock.setblocking(False)
    os.set_blocking(STDIN, False)
    os.set_blocking(STDOUT, False)
    server = sock.fileno()
    up = b""  # read from stdin, not yet sent to the server
    down = b""  # read from the server, not yet written to stdout
    up_open = down_open = True
    while down_open or down:  # (what the server still sends after our stdin's end goes)
        poller = select.poll()
        for fd, mask in _interest(server, up, down, up_open, down_open).items():
            poller.register(fd, mask)
        for fd, mask in poller.poll():
            readable = mask & (select.POLLIN | select.POLLHUP | select.POLLERR)
            writable = mask & (select.POLLOUT | select.POLLHUP | select.POLLERR)
            try:  # (a hang-up or an error shows as the read's end or the write's error)
                if fd == STDIN and readable:
                    up = os.read(STDIN, RELAY_READ)
                    if not up:
                        up_open = False
                        try:
                            sock.shutdown(_socket.SHUT_WR)
                        except OSError:
                            pass
                if fd == server and writable and up:
                    up = up[sock.send(up):]
                if fd == server and readable and not down and down_open:
                    down = sock.recv(RELAY_READ)
                    if not down:
                        down_open = False
                if fd == STDOUT and writable and down:
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
        events[sock] = select.POLLOUT
    elif up_open and down_open:
        events[STDIN] = select.POLLIN
    if down:
        events[STDOUT] = select.POLLOUT
    elif down_open:
        events[sock] = events.get(sock, 0) | select.POLLIN
    return events
