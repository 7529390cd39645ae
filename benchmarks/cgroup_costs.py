"""What containment's kernel work costs a session, piece by piece (docs/containment.md).

    python -m benchmarks.cgroup_costs [--rounds 200] [--quiet 0.2]

In a cgroup of its own under this process's cgroup (as `serve --cgroup auto` makes them):
`mkdir` of a session's cgroup, the move into it (`cgroup.procs`, as the server moves
itself to spawn there), the move back, and the `rmdir`, each timed alone. Once with the
rounds back to back (a busy server), once after ``--quiet`` seconds with nothing moved
(a quiet host's first session: the first move waits for the kernel to leave its fast
path, an RCU grace period, unless the hierarchy is mounted with `favordynmods`). Prints
the medians and the 90th percentiles in microseconds, and the mount's options.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

from ttyserve.backends.cgroups import cgroup2_mount, own_cgroup

from .stats import median, percentile

STEPS = ("mkdir", "move in", "move back", "rmdir")


def _timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return (time.perf_counter() - start) * 1e6


def _move(directory: str) -> None:
    fd = os.open(os.path.join(directory, "cgroup.procs"), os.O_WRONLY)
    try:
        os.write(fd, b"0")
    finally:
        os.close(fd)


def one_session(base: str, home: str, index: int) -> dict[str, float]:
    """The four steps of one session's cgroup, each timed."""
    path = os.path.join(base, f"s{index}")
    return {"mkdir": _timed(lambda: os.mkdir(path)),
            "move in": _timed(lambda: _move(path)),
            "move back": _timed(lambda: _move(home)),
            "rmdir": _timed(lambda: os.rmdir(path))}


def mount_options(mount: str) -> str:
    with open("/proc/self/mountinfo") as file:
        for line in file:
            fields = line.split()
            if fields[4] == mount:
                return fields[-1]  # the super block's options (favordynmods is one)
    return "?"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--quiet", type=float, default=0.2,
                        help="seconds with nothing moved before each quiet round")
    args = parser.parse_args()
    home, mount = own_cgroup(), cgroup2_mount()
    if home is None or mount is None:
        print("no cgroup v2 here", file=sys.stderr)
        return 1
    base = os.path.join(home, f"ttyserve-costs-{os.getpid()}")
    os.mkdir(base)
    try:
        busy = [one_session(base, home, index) for index in range(args.rounds)]
        quiet_rounds = max(args.rounds // 20, 5)
        quiet = []
        for index in range(quiet_rounds):
            time.sleep(args.quiet)
            quiet.append(one_session(base, home, index))
    finally:
        _move(home)
        os.rmdir(base)
    print(f"cgroup2 at {mount} ({mount_options(mount)}), Linux {os.uname().release}; "
          f"{args.rounds} busy rounds, {quiet_rounds} after {args.quiet} s quiet")
    print(f"{'step':<10} {'busy p50 us':>12} {'busy p90':>10} {'quiet p50 us':>13} "
          f"{'quiet p90':>10}")
    for step in STEPS:
        b = [run[step] for run in busy]
        q = [run[step] for run in quiet]
        print(f"{step:<10} {median(b):>12.1f} {percentile(b, 90):>10.1f} "
              f"{median(q):>13.1f} {percentile(q, 90):>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
