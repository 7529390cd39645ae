"""What a server keeps per session it has served: RSS, tracemalloc and object counts.

    python -m benchmarks.session_memory [--sessions 2000] [--kinds plain,echo,...]
                                        [--trace] [--journal] [--workers 8]

Starts a server in a child process (`--serve`, this same file) on a Unix socket under
/tmp, with a short --keep-ended, and drives it with the library client, one kind of
session after another: `plain` (`true`, pipe or PTY), `echo` (`cat` fed bytes, then EOF),
`cancel`, `mux` (several at once on one multiplexed connection), `detach` (detachable,
detached, attached again on another connection), `drop` (the connection dropped
mid-session, detachable or not). After each kind it waits past keep-ended and asks the
server for its numbers, taken after gc.collect(): RSS, RSS after malloc_trim(0),
tracemalloc's traced total (`--trace`), the Python objects by type that grew, and the
allocation sites (by traceback) that grew. Prints bytes per session for each kind.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import gc
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

KINDS = ("plain", "echo", "cancel", "mux", "detach", "drop")
KEEP_ENDED = 1.0
TRIM_DELAY = 5.0  # ttyserve.server.trim's (the server there may be older)
FRAMES = 12


# --- the server's side ------------------------------------------------------------------


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _malloc() -> dict[str, int]:
    """glibc's heap (every arena): bytes in use, free inside it, mapped apart; pymalloc's
    arenas (from sys._debugmallocstats) and the bytes of the blocks in use in them."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    info = libc.mallinfo2()
    answer = {"glibc_in_use": info.uordblks, "glibc_free": info.fordblks,
              "glibc_mmapped": info.hblkhd}
    with tempfile.TemporaryFile("w+") as out:
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        for line in out:
            key, _, value = line.partition("=")
            if line.startswith("# arenas allocated current"):
                answer["pymalloc_arenas"] = int(value.replace(",", ""))
            elif line.startswith("# arenas highwater mark"):
                answer["pymalloc_arenas_highwater"] = int(value.replace(",", ""))
            elif line.startswith("# bytes in allocated blocks"):
                answer["pymalloc_used"] = int(value.replace(",", ""))
            elif line.startswith("# bytes in available blocks"):
                answer["pymalloc_free_blocks"] = int(value.replace(",", ""))
            elif "unused pools" in key:
                answer["pymalloc_unused_pools"] = int(value.replace(",", ""))
    return answer


def _types() -> collections.Counter[str]:
    return collections.Counter(type(o).__qualname__ for o in gc.get_objects())


class Probe:
    """Answers `snap NAME` lines on stdin with a JSON line of numbers since the last snap."""

    def __init__(self, trace: bool, top: int) -> None:
        self.trace = trace
        self.top = top
        self.types = _types()
        self.snapshot = tracemalloc.take_snapshot() if trace else None

    def snap(self, name: str) -> dict[str, Any]:
        before = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
        rss_before_gc = _rss_kib()
        unreachable = gc.collect()
        after = _types()
        garbage = {k: before[k] - after.get(k, 0) for k in before
                   if before[k] - after.get(k, 0) > 0}
        rss = _rss_kib()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        trimmed = _rss_kib()
        types = _types()
        grown = {k: types[k] - self.types.get(k, 0) for k in types
                 if types[k] - self.types.get(k, 0) > 0}
        answer: dict[str, Any] = {
            "name": name, "rss_kib": rss, "rss_trimmed_kib": trimmed,
            "gc_objects": sum(types.values()), "malloc": _malloc(),
            "rss_before_gc_kib": rss_before_gc, "unreachable": unreachable,
            "garbage": dict(sorted(garbage.items(), key=lambda kv: -kv[1])[:self.top]),
            "types_grown": dict(sorted(grown.items(), key=lambda kv: -kv[1])[:self.top])}
        self.types = types
        if self.trace:
            snapshot = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)])
            assert self.snapshot is not None
            stats = snapshot.compare_to(self.snapshot, "traceback")
            answer["traced"] = tracemalloc.get_traced_memory()[0]
            answer["sites"] = [
                {"size_diff": s.size_diff, "count_diff": s.count_diff,
                 "where": [f"{f.filename.split('/ttyserve/')[-1]}:{f.lineno}"
                           for f in s.traceback[-6:]]}
                for s in stats[:self.top] if s.size_diff > 0]
            answer["survivors"] = [
                {"size_diff": s.size_diff, "count_diff": s.count_diff,
                 "where": [f"{f.filename.split('/ttyserve/')[-1]}:{f.lineno}"
                           for f in s.traceback[-6:]]}
                for s in sorted(stats, key=lambda s: -s.count_diff)[:self.top]
                if s.count_diff > 0]
            self.snapshot = snapshot
        return answer


def serve(path: str, trace: bool, journal: str | None, top: int, keep_ended: float,
          max_sessions: int) -> None:
    import anyio

    from ttyserve.addresses import Address
    from ttyserve.server.journal import Journal
    from ttyserve.server.listener import Server
    from ttyserve.server.settings import ServerSettings
    from ttyserve.server.sockets import SocketLease, open_listeners

    if trace:
        tracemalloc.start(FRAMES)

    async def main() -> None:
        import asyncio

        linger = float(os.environ.get("LINGER", "0.3"))
        settings = ServerSettings(command=["/bin/sh"], linger=linger, keep_ended=keep_ended,
                                  max_sessions=max_sessions,
                                  max_sessions_per_connection=512, cgroup="off",
                                  journal=journal)
        opened = Journal(journal) if journal is not None else None
        server = Server(settings, journal=opened)
        leases: list[SocketLease] = []
        listeners = open_listeners([Address("unix", path=path)], leases)
        probe: Probe | None = None
        loop = asyncio.get_running_loop()
        lines = os.fdopen(0, "r")

        def command() -> None:
            nonlocal probe
            line = lines.readline().strip()
            if not line or line == "quit":
                loop.remove_reader(0)
                server.shutdown()
                return
            if probe is None:
                gc.collect()
                probe = Probe(trace, top)
                answer: dict[str, Any] = {"name": line.split()[1], "rss_kib": _rss_kib()}
            else:
                answer = probe.snap(line.split()[1])
            answer["sessions"] = len(server.registry.sessions)
            answer["handlers"] = len(server.handlers)
            print(json.dumps(answer), flush=True)

        loop.add_reader(0, command)
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, listeners, lambda a: print("listening", flush=True))
        for lease in leases:
            lease.release()

    anyio.run(main)


# --- the client's side ------------------------------------------------------------------


async def one(kind: str, address: str, rng: random.Random) -> None:
    import anyio

    from ttyserve.client import connect, run
    from ttyserve.errors import ErrorCode, RequestError, SessionDetached

    if kind == "plain":
        result = await run(["true"], address=address, pty=rng.random() < 0.5)
        assert result.status.code == 0, result
    elif kind == "echo":
        data = rng.randbytes(rng.randrange(1, 4000)).replace(b"\x04", b"")
        result = await run(["cat"], address=address, input=data, pty=False)
        assert result.stdout == data
    elif kind == "cancel":
        async with connect(address) as conn:
            session = await conn.spawn(["/bin/sh", "-c", "sleep 30 & cat"],
                                       pty=rng.random() < 0.5)
            await session.send(b"x\n")
            await session.cancel()
    elif kind == "mux":
        async with (connect(address, multiplex=True, window=1 << 16) as conn,
                    anyio.create_task_group() as tg):
            for n in range(4):
                async def each(n: int = n) -> None:
                    session = await conn.spawn(["/bin/sh", "-c", f"echo {n}"],
                                               pty=n % 2 == 0)
                    status = await session.wait()
                    assert status.code == 0
                tg.start_soon(each)
    elif kind == "detach":
        async with connect(address) as conn:
            session = await conn.spawn(["/bin/sh", "-c", "read x; echo got $x"],
                                       pty=rng.random() < 0.5, detachable=True)
            assert session.id is not None
            await session.detach()
            with contextlib.suppress(SessionDetached):
                async for _ in session:
                    pass
        async with connect(address) as conn:
            again = await conn.attach(session.id)
            await again.send(b"hi\n")
            status = await again.wait()
            assert status.code == 0, status
    elif kind == "drop":
        detachable = rng.random() < 0.5
        async with connect(address) as conn:
            session = await conn.spawn(["/bin/sh", "-c", "read x; echo got $x"],
                                       pty=rng.random() < 0.5, detachable=detachable)
            # leave without a word: the connection closes under the session
        if detachable:
            assert session.id is not None
            while True:  # until the server has seen the connection go
                try:
                    async with connect(address) as conn:
                        again = await conn.attach(session.id)
                        await again.send(b"hi\n")
                        await again.wait()
                        break
                except RequestError as exc:
                    if exc.code != ErrorCode.SESSION_IN_USE:
                        raise
                    await anyio.sleep(0.01)
    else:
        raise ValueError(kind)


async def drive(kind: str, address: str, sessions: int, workers: int, seed: int,
                faults: bool = False) -> int:
    """Run ``sessions`` of ``kind``; with ``faults`` (a worker killed under them), a session
    that fails is counted as run and the next one goes on."""
    import anyio

    per_round = 4 if kind == "mux" else 1
    rounds = max(1, sessions // per_round)
    left = [rounds]

    async def worker(n: int) -> None:
        from ttyserve.errors import ErrorCode, RequestError

        rng = random.Random(seed * 1000 + n)
        while left[0] > 0:
            left[0] -= 1
            while True:
                try:
                    await one(kind, address, rng)
                    break
                except RequestError as exc:  # --max-sessions, the kept ones counted
                    if exc.code != ErrorCode.BUSY:
                        if faults:
                            break
                        raise
                    await anyio.sleep(0.05)
                except Exception:  # (a lost worker's: ConnectionLost, in groups too)
                    if not faults:
                        raise
                    break

    async with anyio.create_task_group() as tg:
        for n in range(workers):
            tg.start_soon(worker, n)
    return rounds * per_round


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=2000, help="of each kind")
    parser.add_argument("--warm-up", type=int, default=200, help="of each kind, first")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--trace", action="store_true", help="tracemalloc in the server")
    parser.add_argument("--journal", action="store_true", help="the server keeps one")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--keep-ended", type=float, default=KEEP_ENDED)
    parser.add_argument("--max-sessions", type=int, default=1024)
    parser.add_argument("--held", action="store_true",
                        help="also measure at once after each kind, its ended sessions kept")
    parser.add_argument("--repeat", type=int, default=1, help="run each kind this often")
    parser.add_argument("--mix", action="store_true",
                        help="every kind at once, as one run (no per-kind numbers)")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--journal-path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.trace, args.journal_path, args.top, args.keep_ended,
              args.max_sessions)
        return

    import anyio

    kinds = args.kinds.split(",")
    directory = tempfile.mkdtemp(prefix="ttys-mem-", dir="/tmp")
    path = os.path.join(directory, "s.sock")
    argv = [sys.executable, "-m", "benchmarks.session_memory", "--serve", path,
            "--top", str(args.top), "--keep-ended", str(args.keep_ended),
            "--max-sessions", str(args.max_sessions)]
    if args.trace:
        argv.append("--trace")
    if args.journal:
        argv += ["--journal-path", os.path.join(directory, "journal")]
    server = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert server.stdin is not None and server.stdout is not None
    assert server.stdout.readline().strip() == "listening"
    address = f"unix:{path}"

    def snap(name: str, wait: bool = True) -> dict[str, Any]:
        assert server.stdin is not None and server.stdout is not None
        if wait:
            time.sleep(args.keep_ended + TRIM_DELAY + 1.5)  # past keep-ended and the trim
        server.stdin.write(f"snap {name}\n")
        server.stdin.flush()
        return dict(json.loads(server.stdout.readline()))

    async def mixed(total: int, seed: int) -> int:
        async with anyio.create_task_group() as tg:
            for n, kind in enumerate(kinds):
                tg.start_soon(drive, kind, address, total // len(kinds),
                              max(1, args.workers // len(kinds)), seed + n)
        return total

    try:
        for kind in kinds:  # the warm-up: every code path once, caches and free lists filled
            anyio.run(drive, kind, address, args.warm_up, args.workers, 1)
        start = snap("start")
        print(f"start: RSS {start['rss_kib']} KiB", flush=True)
        first_rss = start["rss_kib"]
        phases = ([("mix", None)] if args.mix else [(k, k) for k in kinds]) * args.repeat
        for n, (name, kind) in enumerate(phases):
            began = time.monotonic()
            if kind is None:
                done = anyio.run(mixed, args.sessions, 2 + n)
            else:
                done = anyio.run(drive, kind, address, args.sessions, args.workers, 2 + n)
            took = time.monotonic() - began
            if args.held:
                held = snap(f"{name}-held", wait=False)
                print(f"{name:7} held: RSS {held['rss_kib']} KiB, {held['sessions']} sessions "
                      f"kept; malloc {held['malloc']}", flush=True)
                for site in held.get("sites", []):
                    print(f"   held {site['size_diff']:+9d} B {site['count_diff']:+6d} "
                          f"{' <- '.join(reversed(site['where']))}", flush=True)
            answer = snap(name)
            grown = answer["rss_kib"] - start["rss_kib"]
            line = (f"{name:7} {done} sessions in {took:.0f} s: RSS {start['rss_kib']} -> "
                    f"{answer['rss_kib']} KiB ({grown * 1024 / done:+.0f} B/session), after "
                    f"malloc_trim {answer['rss_trimmed_kib']} KiB; live sessions "
                    f"{answer['sessions']}, handlers {answer['handlers']}")
            if "traced" in answer:
                line += f"; traced {answer['traced'] / 1024:.0f} KiB"
            print(line, flush=True)
            if "unreachable" in answer:
                print(f"   gc.collect(): {answer['unreachable']} unreachable; RSS before it "
                      f"{answer['rss_before_gc_kib']} KiB; garbage {answer['garbage']}",
                      flush=True)
            if "malloc" in answer:
                print("   malloc:", answer["malloc"], flush=True)
            if answer.get("types_grown"):
                print("   objects grown:", answer["types_grown"], flush=True)
            if "sites" in answer:
                traced_growth = sum(s["size_diff"] for s in answer["sites"])
                print(f"   traced growth (top sites) {traced_growth / done:+.0f} B/session",
                      flush=True)
                for site in answer["sites"]:
                    print(f"   {site['size_diff']:+9d} B {site['count_diff']:+6d} "
                          f"{' <- '.join(reversed(site['where']))}", flush=True)
            for site in answer.get("survivors", []):
                print(f"   survivor {site['size_diff']:+9d} B {site['count_diff']:+6d} "
                      f"{' <- '.join(reversed(site['where']))}", flush=True)
            start = answer
        print(f"overall: RSS {first_rss} -> {start['rss_kib']} KiB "
              f"(+{(start['rss_kib'] - first_rss) / 1024:.1f} MiB)", flush=True)
    finally:
        server.stdin.write("quit\n")
        server.stdin.flush()
        server.wait(30)
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
