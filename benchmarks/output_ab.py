"""Pipe output side by side: two checkouts of ttyserve, alternating, over a Unix socket.

    python -m benchmarks.output_ab BEFORE_DIR AFTER_DIR [--size BYTES] [--reps N]
    git worktree add /tmp/before HEAD~1   # the code to compare with, for example

Each repetition streams ``head -c SIZE /dev/zero`` in pipe mode from each server in turn
(the order alternates), read by the wire client (frames counted, never copied out), and
the same through `ttyserve exec` into a pipe that `cat` drains. Prints each repetition and
the medians: MB/s, the server's CPU seconds per GB, and B against A.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .procs import cpu_seconds
from .session_ab import start
from .stats import median
from .wire import WireSession


def wire_stream(path: str, size: int) -> float:
    """Seconds to receive ``size`` bytes of output with the wire client."""
    began = time.perf_counter()
    with WireSession(f"unix:{path}") as wire:
        wire.start(["head", "-c", str(size), "/dev/zero"], pty=False)
        got = wire.count_until_exit()
    if got != size:
        raise SystemExit(f"received {got} of {size} bytes")
    return time.perf_counter() - began


def exec_stream(root: str, path: str, size: int) -> float:
    """Seconds for `ttyserve exec` to write ``size`` bytes of output into a pipe."""
    env = {**os.environ, "PYTHONPATH": root, "TTYSERVE_WARM": "0"}
    began = time.perf_counter()
    client = subprocess.Popen(
        [sys.executable, "-m", "ttyserve", "exec", f"--connect=unix:{path}", "--",
         "head", "-c", str(size), "/dev/zero"], stdout=subprocess.PIPE, env=env, cwd="/tmp")
    assert client.stdout is not None
    counted = subprocess.run(["wc", "-c"], stdin=client.stdout, capture_output=True,
                             check=True).stdout
    client.stdout.close()
    if client.wait() != 0 or int(counted) != size:
        raise SystemExit(f"exec: status {client.returncode}, {int(counted)} of {size} bytes")
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.output_ab",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("a", help="a checkout's directory")
    parser.add_argument("b", help="a checkout's directory")
    parser.add_argument("--size", type=int, default=1 << 30)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="output-ab-"))
    servers: list[subprocess.Popen[bytes]] = []
    try:
        roots = (args.a, args.b)
        paths = [str(directory / f"{name}.sock") for name in ("a", "b")]
        servers = [start(root, path) for root, path in zip(roots, paths, strict=True)]
        results: dict[str, list[list[float]]] = {"wire MB/s": [[], []], "wire CPU s/GB": [[], []],
                                                 "exec MB/s": [[], []]}
        for rep in range(args.reps):
            order = (0, 1) if rep % 2 == 0 else (1, 0)
            for i in order:
                before = cpu_seconds(servers[i].pid)
                seconds = wire_stream(paths[i], args.size)
                cpu = cpu_seconds(servers[i].pid) - before
                results["wire MB/s"][i].append(args.size / seconds / 1e6)
                results["wire CPU s/GB"][i].append(cpu / (args.size / 1e9))
                results["exec MB/s"][i].append(
                    args.size / exec_stream(roots[i], paths[i], args.size) / 1e6)
            print(f"rep {rep + 1}: " + "; ".join(
                f"{name} {values[0][-1]:.3g} / {values[1][-1]:.3g}"
                for name, values in results.items()), flush=True)
        for name, (a, b) in results.items():
            ratios = [y / x for x, y in zip(a, b, strict=True) if x]  # (a CPU time under a
            shown = f"{median(ratios):.2f}" if ratios else "n/a"  # clock tick reads 0)
            print(f"{name:14} A {median(a):8.3g}  B {median(b):8.3g}  B/A {shown}")
    finally:
        for server in servers:
            server.send_signal(signal.SIGINT)
            server.wait()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
