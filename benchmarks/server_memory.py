"""What the whole server keeps after many sessions, with its defaults: `ttyserve serve`
(one worker per CPU, containment where the machine allows it, a journal), the RSS of the
supervisor and its workers together, after a warm-up and after every round of sessions.

    python -m benchmarks.server_memory [--sessions 102000] [--round 6000] [--keep-ended 1]
                                       [--faults]

Each round drives the mix of benchmarks.session_memory (plain pipe and PTY sessions, stdin
echoed back, cancels, multiplexed connections, detach and attach again from a new
connection, which lands on either worker and so often goes over a hop, and connections
dropped mid-session), two clients of each kind at once, then waits past --keep-ended and
the server's trim before reading /proc. Prints the total and its growth since the warm-up.
With --faults, one worker is SIGKILLed in the middle of every round (the supervisor starts
another; the sessions it held end with exit -1, their clients go on with the next).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anyio

from .session_memory import KINDS, drive

SETTLE = 8.0  # seconds after a round: past keep-ended and the server's malloc trim


def workers_of(pid: int) -> list[int]:
    """The ttyserve processes among ``pid``'s children (its workers)."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    found = []
    for each in map(int, children.stdout.split()):
        try:
            if b"ttyserve" in Path(f"/proc/{each}/cmdline").read_bytes():
                found.append(each)
        except OSError:
            continue
    return found


def server_rss_kib(pid: int) -> tuple[int, int]:
    """The RSS of ``pid`` and its workers together, and how many processes they are."""
    total = count = 0
    for each in [pid, *workers_of(pid)]:
        try:
            status = Path(f"/proc/{each}/status").read_text()
        except OSError:
            continue
        rss = [line for line in status.splitlines() if line.startswith("VmRSS:")]
        if rss:  # (none: a worker being reaped)
            total += int(rss[0].split()[1])
            count += 1
    return total, count


def kill_a_worker(pid: int, rng: random.Random) -> None:
    if workers := workers_of(pid):
        os.kill(rng.choice(workers), signal.SIGKILL)


def mix(address: str, sessions: int, seed: int, fault: Callable[[], None] | None = None,
        ) -> None:
    """A round of the mix; ``fault`` runs once, in a thread, while it is under way."""
    async def main() -> None:
        async with anyio.create_task_group() as tg:
            for n, kind in enumerate(KINDS):
                tg.start_soon(drive, kind, address, sessions // len(KINDS), 2, seed * 10 + n,
                              fault is not None)
            if fault is not None:
                await anyio.sleep(1.0)  # (well into the round)
                await anyio.to_thread.run_sync(fault)
    anyio.run(main)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=102_000)
    parser.add_argument("--round", type=int, default=6000)
    parser.add_argument("--warm-up", type=int, default=1200)
    parser.add_argument("--keep-ended", type=float, default=1.0)
    parser.add_argument("--faults", action="store_true",
                        help="SIGKILL a worker in the middle of every round")
    args = parser.parse_args()
    rng = random.Random(38)
    directory = tempfile.mkdtemp(prefix="ttyserve-memory-")
    address = f"unix:{directory}/s.sock"
    with open(f"{directory}/stderr", "w") as stderr:
        server = subprocess.Popen(
            [sys.executable, "-m", "ttyserve", "serve", "--listen", address, "--journal",
             f"{directory}/journal", "--keep-ended", str(args.keep_ended),
             "--max-sessions", "4096"], stdout=subprocess.PIPE, stderr=stderr)
    try:
        assert server.stdout is not None and server.stdout.readline().startswith(b"listening")
        began = time.monotonic()
        mix(address, args.warm_up, 1)
        time.sleep(SETTLE)
        start, processes = server_rss_kib(server.pid)
        print(f"after the warm-up: {start / 1024:.1f} MiB in {processes} processes",
              flush=True)
        done = 0
        while done < args.sessions:
            mix(address, args.round, 2 + done // args.round,
                (lambda: kill_a_worker(server.pid, rng)) if args.faults else None)
            done += args.round
            time.sleep(SETTLE)
            now, _ = server_rss_kib(server.pid)
            print(f"after {done:,} sessions ({time.monotonic() - began:.0f} s): "
                  f"{now / 1024:.1f} MiB (+{(now - start) / 1024:.1f})", flush=True)
    finally:
        server.terminate()
        server.wait(60)


if __name__ == "__main__":
    main()
