"""A minimal blocking ttyserve client: the least a client can cost (docs/protocol.md).

No event loop, no frame objects: one socket, one receive buffer, headers parsed
in place, bulk output counted without being copied out of the buffer. It lets
the benchmarks measure the server rather than the client library.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

HEADER = struct.Struct(">BII")
STDIN, STDOUT, STDERR, CTRL_IN, CTRL_OUT = range(5)
SMALL_BUFFER = 64 * 1024  # grows to hold a whole frame when one is bigger
BULK_READ = 1024 * 1024  # recv size while counting bulk output


class WireError(Exception):
    """The server refused or broke the protocol, or closed the connection early."""


def frame(kind: int, channel: int, payload: bytes) -> bytes:
    return HEADER.pack(kind, channel, len(payload)) + payload


def control(channel: int, message: dict[str, Any]) -> bytes:
    return frame(CTRL_IN, channel, json.dumps(message, separators=(",", ":")).encode())


def connect_socket(address: str) -> socket.socket:
    """A blocking socket to ``unix:PATH`` or ``tcp:HOST:PORT`` (TCP_NODELAY set)."""
    scheme, _, rest = address.partition(":")
    if scheme == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        target: Any = rest
    elif scheme == "tcp":
        host, _, port = rest.rpartition(":")
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        target = (host.strip("[]"), int(port))
    else:
        raise ValueError(f"unsupported address {address!r}")
    try:
        sock.connect(target)
    except BaseException:
        sock.close()
        raise
    return sock


class WireSession:
    """One connection carrying a session on channel 1; with `multiplex`, a next one on
    channel 2 once it ended (`open_next`), and so on."""

    def __init__(self, address: str | None = None, token: str | None = None,
                 sock: socket.socket | None = None) -> None:
        """A connection to ``address``, or over ``sock`` (a socketpair to `serve --stdio`)."""
        self.sock = sock if sock is not None else connect_socket(address or "")
        self.channel = 1
        self._buf = bytearray(SMALL_BUFFER)
        self._view = memoryview(self._buf)
        self._bulk: bytearray | None = None
        self._start = 0
        self._end = 0
        self._skip = 0  # payload bytes of the current data frame not yet consumed
        self._token = token
        self.pid: int | None = None
        self.exit: dict[str, Any] | None = None

    def close(self) -> None:
        self._view.release()
        self.sock.close()

    def __enter__(self) -> WireSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- sending --------------------------------------------------------------

    def start(self, argv: list[str], pty: bool, rows: int = 24, cols: int = 80,
              multiplex: bool = False) -> None:
        """Send `hello` and `open` in one write (pipelined, as the contract allows)."""
        hello: dict[str, Any] = {"type": "hello", "protocol": 1, "client": "ttyserve-bench",
                                 "multiplex": multiplex}
        if self._token is not None:
            hello["token"] = self._token
        opening = {"type": "open", "argv": argv, "pty": pty, "rows": rows, "cols": cols}
        self.sock.sendall(control(0, hello) + control(self.channel, opening))

    def open_next(self, argv: list[str], pty: bool) -> None:
        """On a multiplexed connection whose session ended: the next one, a channel up."""
        self.channel += 1
        self.pid = self.exit = None
        self.sock.sendall(control(self.channel, {"type": "open", "argv": argv, "pty": pty}))

    def send(self, data: bytes) -> None:
        self.sock.sendall(frame(STDIN, self.channel, data))

    # --- receiving ------------------------------------------------------------

    def _fill(self, need: int = 1) -> None:
        """Receive more; make room first so that ``need`` bytes from ``_start`` fit."""
        size = self._end - self._start
        if self._start and (size == 0 or len(self._buf) - self._start < max(need, 4096)):
            self._buf[:size] = self._buf[self._start:self._end]
            self._start, self._end = 0, size
        if len(self._buf) - self._start < need:
            self._view.release()
            self._buf.extend(bytes(need - (len(self._buf) - self._start)))
            self._view = memoryview(self._buf)
        received = self.sock.recv_into(self._view[self._end:])
        if not received:
            raise WireError("the server closed the connection before the session's exit")
        self._end += received

    def _on_control(self, channel: int, payload: bytes) -> None:
        message = json.loads(payload)
        kind = message.get("type")
        if kind == "error":
            raise WireError(f"channel {channel}: {message.get('code')}: {message.get('message')}")
        if channel != self.channel:
            return
        if kind == "opened":
            self.pid = message["pid"]
        elif kind == "exit":
            self.exit = message

    def _next(self, want_data: bool) -> tuple[int, bytes] | None:
        """Consume one frame header (and a control frame whole).

        Returns (kind, payload) for a data frame when ``want_data`` (payload copied),
        else sets ``_skip`` to its length and returns None; control frames return None.
        """
        while self._end - self._start < HEADER.size:
            self._fill()
        kind, channel, length = HEADER.unpack_from(self._buf, self._start)
        self._start += HEADER.size
        if kind in (STDOUT, STDERR) and not want_data:
            self._skip = length
            return None
        while self._end - self._start < length:
            self._fill(length)
        payload = bytes(self._view[self._start:self._start + length])
        self._start += length
        if kind in (STDOUT, STDERR):
            return kind, payload
        self._on_control(channel, payload)
        return None

    def read_data(self) -> bytes:
        """The next output payload; raises WireError if the session ends first."""
        while True:
            if self.exit is not None:
                raise WireError(f"the session exited: {self.exit}")
            item = self._next(want_data=True)
            if item is not None and item[1]:
                return item[1]

    def read_until(self, marker: bytes) -> bytes:
        data = b""
        while marker not in data:
            data += self.read_data()
        return data

    def count_until_exit(self) -> int:
        """Count output bytes until the `exit` frame, without copying them out."""
        total = 0
        recv_into = self.sock.recv_into
        if self._bulk is None:
            self._bulk = bytearray(BULK_READ)
        bulk = memoryview(self._bulk)
        while self.exit is None:
            if self._skip:
                available = self._end - self._start
                if available:
                    taken = min(available, self._skip)
                    self._start += taken
                else:
                    taken = recv_into(bulk, min(self._skip, BULK_READ))
                    if not taken:
                        raise WireError("the server closed the connection mid-frame")
                total += taken
                self._skip -= taken
                continue
            self._next(want_data=False)
        return total
