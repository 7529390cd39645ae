"""Would splice(2) pay on the output path? The server's relay with and without it.

Server side: a command's stdout pipe is relayed into a socket as framed
output, the way the server does it: read up to 128 KiB from the pipe and send a
frame header and the bytes with one sendmsg (two copies), or send the header
and `splice` the same bytes from the pipe into the socket (one copy fewer where
the socket takes pages). A reader process drains the socket.

Client side (`exec` writing to a pipe): the reader takes each frame's header,
then either receives the payload and writes it to its stdout pipe, or splices
it from the socket into that pipe; `cat > /dev/null` drains the pipe.

Run: `python -m benchmarks.splice_probe`.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import resource
import select
import socket
import subprocess
import sys
import termios
import time

from ttyserve.defaults import OUTPUT_CHUNK as CHUNK  # the largest output frame
from ttyserve.protocol.frames import HEADER, FrameKind

from .stats import Summary, cell, number

PIPE_SIZE = 1 << 20
CHANNEL = 1


def _header(size: int) -> bytes:
    return HEADER.pack(FrameKind.STDOUT, CHANNEL, size)


def _relay_copy(pipe: int, sock: socket.socket) -> tuple[int, int]:
    """As the server sends: header and bytes in one sendmsg. (Payload, frames) sent."""
    payload = frames = 0
    while data := os.read(pipe, CHUNK):
        frame = [_header(len(data)), data]
        sent = sock.sendmsg(frame)
        if sent < HEADER.size + len(data):
            sock.sendall(memoryview(b"".join(frame))[sent:])
        payload, frames = payload + len(data), frames + 1
    return payload, frames


def _relay_splice(pipe: int, sock: socket.socket) -> tuple[int, int]:
    """The header, then the frame's bytes spliced from the pipe. (Payload, frames) sent."""
    available = bytearray(4)
    out, payload, frames = sock.fileno(), 0, 0
    readable = select.poll()
    readable.register(pipe, select.POLLIN)
    while True:
        readable.poll()  # data, or the writer's end: then nothing is buffered
        fcntl.ioctl(pipe, termios.FIONREAD, available)
        n = min(int.from_bytes(available, sys.byteorder), CHUNK)
        if n == 0:
            return payload, frames
        sock.sendall(_header(n), socket.MSG_MORE)
        payload, frames = payload + n, frames + 1
        while n:  # the frame stays in flight until its last byte is spliced
            n -= os.splice(pipe, out, n)


def _drain(sock: socket.socket) -> int:
    """Read the socket to its end; the bytes read."""
    buf, total = bytearray(1 << 20), 0
    while got := sock.recv_into(buf):
        total += got
    return total


def _frames_to(sock: socket.socket, out: int, method: str) -> int:
    """Each frame's payload to ``out`` (a pipe), received and written, or spliced; the
    bytes read."""
    buf = bytearray(CHUNK)
    view, total = memoryview(buf), 0
    while header := sock.recv(HEADER.size, socket.MSG_WAITALL):
        n = HEADER.unpack(header)[2]
        total += HEADER.size + n
        if method == "splice":
            while n:
                n -= os.splice(sock.fileno(), out, n)
            continue
        got = sock.recv_into(view[:n], n, socket.MSG_WAITALL)
        written = 0
        while written < got:
            written += os.write(out, view[written:got])
    return total


def _pair(kind: str) -> tuple[socket.socket, socket.socket]:
    if kind == "unix":
        return socket.socketpair()
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client, accepted


def run(kind: str, side: str, method: str, size: int) -> tuple[float, float]:
    """One relay of ``size`` bytes: (MB/s, CPU s/GB of the side measured)."""
    sender, receiver = _pair(kind)
    children: list[subprocess.Popen[bytes]] = []
    try:
        out_fd = -1
        if side == "client":  # the reader writes into a pipe, which `cat` drains
            sink = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
            children.append(sink)
            assert sink.stdin is not None
            fcntl.fcntl(sink.stdin.fileno(), fcntl.F_SETPIPE_SZ, PIPE_SIZE)
            out_fd = sink.stdin.fileno()
        drain = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.splice_probe", "--drain",
             method if side == "client" else "drain", str(receiver.fileno()), str(out_fd)],
            pass_fds=[fd for fd in (receiver.fileno(), out_fd) if fd >= 0],
            stdout=subprocess.PIPE)
        children.append(drain)
        assert drain.stdout is not None
        if drain.stdout.readline() != b"ready\n":  # its start-up is not timed
            raise RuntimeError("the reader did not start")
        receiver.close()
        if side == "client":
            assert children[0].stdin is not None
            children[0].stdin.close()
        producer = subprocess.Popen(["head", "-c", str(size), "/dev/zero"],
                                    stdout=subprocess.PIPE)
        children.append(producer)
        assert producer.stdout is not None
        fcntl.fcntl(producer.stdout.fileno(), fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        began = time.perf_counter()
        relay = _relay_splice if side == "server" and method == "splice" else _relay_copy
        before = resource.getrusage(resource.RUSAGE_SELF)
        payload, frames = relay(producer.stdout.fileno(), sender)
        after = resource.getrusage(resource.RUSAGE_SELF)
        sender.shutdown(socket.SHUT_WR)
        out, _ = drain.communicate()
        for child in children:
            child.wait()
        seconds = time.perf_counter() - began
    finally:
        sender.close()
        receiver.close()
        for child in children:
            if child.poll() is None:
                child.kill()
            child.wait()
            for stream in (child.stdin, child.stdout):
                if stream is not None:
                    stream.close()
    got, client_cpu = out.split()
    sent = payload + frames * HEADER.size
    if payload != size or int(got) != sent:
        raise RuntimeError(f"{method}: {payload} of {size} bytes relayed, {int(got)} of "
                           f"{sent} read")
    cpu = ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
           if side == "server" else float(client_cpu))
    return size / seconds / 1e6, cpu / (size / 1e9)


def drain_main(method: str, sock_fd: int, out: int) -> int:
    """The reader process: drain the socket (or relay its frames to ``out``); print the
    bytes read and its CPU seconds."""
    sock = socket.socket(fileno=sock_fd)
    print("ready", flush=True)
    total = _drain(sock) if method == "drain" else _frames_to(sock, out, method)
    if out >= 0:
        os.close(out)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(total, usage.ru_utime + usage.ru_stime)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1 << 30)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--drain", nargs=3, metavar=("METHOD", "SOCKET_FD", "OUT_FD"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drain:
        return drain_main(args.drain[0], int(args.drain[1]), int(args.drain[2]))
    for side in ("server", "client"):
        for kind in ("unix", "tcp"):
            results: dict[str, list[tuple[float, float]]] = {"copy": [], "splice": []}
            for _ in range(args.reps):  # alternating, so the machine's noise hits both
                for method in results:
                    results[method].append(run(kind, side, method, args.size))
            for method, values in results.items():
                rate = Summary.of([v[0] for v in values])
                cpu = Summary.of([v[1] for v in values])
                print(f"{side:6} {kind:4} {method:6} {cell(rate)} MB/s, {side} CPU "
                      f"{number(cpu.median)} s/GB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
