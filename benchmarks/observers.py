"""N observers of one session, in a process of their own (the `observers` workload): they
attach, say `ready` on stdout, and read everything until the session's exit, as N people
watching would; or (`stall`) never read again once attached, as viewers whose link froze
(a raw socket with 4 KiB of credit that is never given back). Run as
`python -m benchmarks.observers ADDRESS SESSION N read|stall [TOKEN]`."""

from __future__ import annotations

import signal
import socket
import sys

import anyio

from ttyserve.addresses import parse_address
from ttyserve.client import connect
from ttyserve.protocol.frames import FrameDecoder, FrameKind, encode_frame
from ttyserve.protocol.messages import Attach, Hello, encode_message, parse_object

STALLED_WINDOW = 4096


async def watch(address: str, session: str, count: int, token: str | None) -> None:
    async with connect(address, token=token, multiplex=True, window=1 << 20) as conn:
        observers = [await conn.attach(session, role="observer") for _ in range(count)]
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        async with anyio.create_task_group() as group:
            for observer in observers:
                group.start_soon(observer.wait)


def stall(address: str, session: str, count: int, token: str | None) -> None:
    """Attach, then read nothing more until killed."""
    where = parse_address(address)
    if where.scheme == "unix":
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(where.path)
    else:
        sock = socket.create_connection((where.host, where.port))
    hello = Hello(protocol=1, token=token, multiplex=True, window=STALLED_WINDOW)
    sock.sendall(encode_frame(FrameKind.CTRL_IN, 0, encode_message(hello)) + b"".join(
        encode_frame(FrameKind.CTRL_IN, channel, encode_message(
            Attach(session=session, role="observer"))) for channel in range(1, count + 1)))
    decoder = FrameDecoder(1 << 30)
    attached = 0
    while attached < count:
        for frame in decoder.feed(sock.recv(1 << 16)):
            if frame.kind is FrameKind.CTRL_OUT:
                kind, message = parse_object(frame.payload)
                if kind == "error":
                    raise SystemExit(f"refused: {message}")
                attached += kind == "attached"
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        signal.pause()  # read nothing more, until the signal that ends us


if __name__ == "__main__":
    args = (sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[5] if len(sys.argv) > 5
            else None)
    if sys.argv[4] == "stall":
        stall(*args)
    else:
        anyio.run(watch, *args)
