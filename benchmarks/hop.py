"""What a hop between workers costs (`serve --workers 2`): one detachable session reached
from the worker that runs it and from the other one, side by side.

    python -m benchmarks.hop [--rounds 2000] [--bytes 268435456] [--reps 5]

Starts `ttyserve serve --workers 2` on a Unix socket in a temp dir. For each repetition,
in both orders: the keystroke echo through `cat` in a raw PTY (one byte out, the same byte
back, ROUNDS times: p50 and p99), and a pipe session's `head -c BYTES /dev/zero` received
(MB/s), each attached from a connection of the session's own worker ("direct") and of the
other worker ("hop"). Prints the medians and the hop's ratio to direct.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

from ttyserve.client import Connection, connect

from .stats import median, percentile

ECHO = ["sh", "-c", "stty raw -echo && printf R && exec cat"]


async def worker_of(conn: Connection) -> int:
    probe = await conn.spawn(["sh", "-c", "echo $PPID"], pty=False)
    said = b"".join([chunk.data async for chunk in probe])
    await probe.wait()
    return int(said)


async def connection_on(address: str, worker: int, other: bool) -> Connection:
    """A connection (entered: the caller leaves it) served by ``worker`` or, with
    ``other``, by any other."""
    for _ in range(8):
        manager = connect(address, multiplex=True)
        conn = await manager.__aenter__()
        here = await worker_of(conn)
        if (here == worker) != other:
            conn._manager = manager  # type: ignore[attr-defined]
            return conn
        await manager.__aexit__(None, None, None)
    raise RuntimeError("no connection reached the worker wanted")


async def leave(conn: Connection) -> None:
    await conn._manager.__aexit__(None, None, None)  # type: ignore[attr-defined]


async def echo(address: str, session_id: str, home: int, hop: bool, rounds: int,
               held: int) -> list[float]:
    """Round trips of one byte; ``held``: the bytes the session has printed so far (its
    replay, read first)."""
    conn = await connection_on(address, home, hop)
    try:
        session = await conn.attach(session_id)
        replayed = 0
        while replayed < held:
            chunk = await session.receive()
            assert chunk is not None
            replayed += len(chunk.data)
        latencies = []
        for _ in range(rounds):
            start = time.perf_counter()
            await session.send(b"x")
            chunk = await session.receive()
            assert chunk is not None and chunk.data == b"x"
            latencies.append(time.perf_counter() - start)
        await session.detach()
        return latencies
    finally:
        await leave(conn)


async def stream(address: str, size: int, hop: bool) -> float:
    """MB/s of `head -c SIZE /dev/zero`, spawned detachable and detached at once, received
    through a connection of its own worker or of the other."""
    async with connect(address, multiplex=True) as starter:
        home = await worker_of(starter)
        gate = tempfile.mktemp()
        session = await starter.spawn(
            ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.01; done; head -c {size} /dev/zero"],
            pty=False, detachable=True)
        assert session.id is not None
        await session.detach()
    conn = await connection_on(address, home, hop)
    try:
        attached = await conn.attach(session.id)
        start = time.perf_counter()
        Path(gate).touch()
        received = 0
        async for chunk in attached:
            received += len(chunk.data)
        seconds = time.perf_counter() - start
        assert received == size, received
        return size / seconds / 1e6
    finally:
        Path(gate).unlink(missing_ok=True)
        await leave(conn)


async def measure(address: str, rounds: int, size: int, reps: int) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {k: [] for k in (
        "p50 direct", "p50 hop", "p99 direct", "p99 hop", "MB/s direct", "MB/s hop")}
    async with connect(address, multiplex=True) as conn:
        home = await worker_of(conn)
        session = await conn.spawn(ECHO, pty=True, detachable=True)
        assert session.id is not None
        await session.detach()
    held = 1  # the R that says the terminal is raw
    for rep in range(reps):
        for hop in ((False, True) if rep % 2 == 0 else (True, False)):
            kind = "hop" if hop else "direct"
            latencies = await echo(address, session.id, home, hop, rounds, held)
            held += rounds
            found[f"p50 {kind}"].append(percentile(latencies, 50) * 1e6)
            found[f"p99 {kind}"].append(percentile(latencies, 99) * 1e6)
            found[f"MB/s {kind}"].append(await stream(address, size, hop))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--bytes", type=int, default=256 << 20)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="hop-"))
    server = subprocess.Popen(
        [sys.executable, "-m", "ttyserve", "serve", "--workers", "2", "--cgroup", "off",
         "--listen", f"unix:{directory / 's.sock'}"], stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL)
    try:
        assert server.stdout is not None
        line = server.stdout.readline().decode().split()
        assert line[:1] == ["listening"], line
        found = anyio.run(measure, line[1], args.rounds, args.bytes, args.reps)
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(directory, ignore_errors=True)
    print(f"{'metric':<12} {'direct':>10} {'hop':>10} {'hop/direct':>11}")
    for metric in ("p50", "p99", "MB/s"):
        direct, hop = median(found[f"{metric} direct"]), median(found[f"{metric} hop"])
        print(f"{metric + (' us' if metric != 'MB/s' else ''):<12} {direct:>10.1f} "
              f"{hop:>10.1f} {hop / direct:>10.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
