"""Socket activation (systemd's protocol, contracts.md "Running under a service manager"):
when LISTEN_PID is this process and LISTEN_FDS is N, the server serves on descriptors 3 to
3+N-1, which its service manager bound, instead of binding `--listen` itself.

A socket named `ws` or `wss` in LISTEN_FDNAMES answers WebSocket and HTTP (`wss` with the
TLS flags); one named `tls` speaks TLS (our choice: the protocol does not name it); any
other the framed protocol, as `unix:` or `tcp:` by its family. The variables are removed
from the environment once read, so no session inherits them.
"""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping

from ..addresses import Address
from ..errors import ConfigError

FIRST_FD = 3  # SD_LISTEN_FDS_START
NAMED = {"ws": "ws", "wss": "wss", "tls": "tls"}  # a name that says the carriage; else by family
VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


def inherited_listeners(environ: MutableMapping[str, str] | None = None,
                        ) -> list[tuple[Address, socket.socket]]:
    """The listening sockets this process was handed, each with its address; none when it
    was not socket-activated. Raises ConfigError naming a descriptor that is not a
    listening stream socket (or a LISTEN_FDS that is no count)."""
    environ = os.environ if environ is None else environ
    pid, count = environ.get("LISTEN_PID"), environ.get("LISTEN_FDS")
    names = environ.get("LISTEN_FDNAMES", "").split(":")
    for name in VARIABLES:
        environ.pop(name, None)
    if pid is None or count is None or pid != str(os.getpid()):
        return []
    if not count.isdigit():
        raise ConfigError(f"LISTEN_FDS={count!r} is not a number of descriptors")
    found = []
    for index in range(int(count)):
        fd = FIRST_FD + index
        name = names[index] if index < len(names) else ""
        found.append(_listener(fd, name))
    return found


def _listener(fd: int, name: str) -> tuple[Address, socket.socket]:
    what = f"inherited descriptor {fd}" + (f" ({name})" if name else "")
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise ConfigError(f"{what}: not a socket ({exc.strerror})") from None
    try:
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    except OSError:
        listening = 0
    if sock.type != socket.SOCK_STREAM or not listening:
        sock.detach()  # (not ours to close: it is still the service manager's descriptor)
        raise ConfigError(f"{what}: not a listening stream socket")
    os.set_inheritable(fd, False)
    sock.setblocking(False)
    if sock.family == socket.AF_UNIX:
        return Address("unix", path=str(sock.getsockname())), sock
    host, port = sock.getsockname()[:2]
    return Address(NAMED.get(name, "tcp"), host=host, port=port), sock
