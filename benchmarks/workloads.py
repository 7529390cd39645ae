"""The workloads of the performance issues: what each runs, measures and targets.

A workload turns one run of one system into a dict of metric values; the
runner (run.py) alternates systems, repeats, and summarizes. Targets compare
the `ttyserve` column with another column (a ratio) or with a fixed bound.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from . import procs
from .procs import Usage, cpu_seconds, kill_group
from .server import warm_far_side
from .stats import Summary, median, number, percentile
from .systems import NotApplicable, ScaleRun, System, now

ECHO_ARGV = ["sh", "-c", "stty raw -echo && printf R && exec cat"]
TARGET_SYSTEM = "ttyserve"
MB = 1e6
GB = 1e9


@dataclass(frozen=True)
class Sizes:
    """How much work one run does."""

    pty_bytes: int
    pipe_bytes: int
    echo_rounds: int
    sessions: int
    scale_sessions: int
    scale_rounds: int
    exec_bytes: int
    fanout_targets: int
    ssh_targets: int
    pipe_connections: int
    pipe_per_connection: int


FULL = Sizes(pty_bytes=100_000_000, pipe_bytes=1 << 30, echo_rounds=2000, sessions=200,
             scale_sessions=1000, scale_rounds=500, exec_bytes=1 << 30,
             fanout_targets=100, ssh_targets=64, pipe_connections=40,
             pipe_per_connection=100)
QUICK = Sizes(pty_bytes=8_000_000, pipe_bytes=64 << 20, echo_rounds=200, sessions=20,
              scale_sessions=50, scale_rounds=50, exec_bytes=64 << 20,
              fanout_targets=8, ssh_targets=8, pipe_connections=4,
              pipe_per_connection=10)


@dataclass
class Context:
    """What every workload of one run shares."""

    workdir: str
    sizes: Sizes
    transport: str  # "tcp" or "unix": how ttyserve is reached where a workload does not say


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    higher_is_better: bool = False  # throughputs and rates; times, memory and CPU are lower


@dataclass(frozen=True)
class Target:
    """`ttyserve`'s median ``op`` ``bound`` (times the ``versus`` column's median, if given)."""

    metric: str
    op: str  # ">=", "<=" or "<"
    bound: float
    versus: str | None = None
    system: str = TARGET_SYSTEM  # whose median is held to it

    def describe(self) -> str:
        who = "" if self.system == TARGET_SYSTEM else f"{self.system} "
        if self.versus is None:
            return f"{who}{self.op}{self.bound:g}"
        return f"{who}{self.op}{self.bound:g}x {self.versus}"

    def check(self, column: dict[str, Summary]) -> tuple[bool | None, str]:
        """(met, shown value); met is None when a needed column is missing."""
        ours = column.get(self.system)
        if ours is None:
            return None, f"n/a (no {self.system})"
        value = ours.median
        if self.versus is not None:
            other = column.get(self.versus)
            if other is None or other.median == 0:
                return None, f"n/a (no {self.versus})"
            value = value / other.median
        met = {">=": value >= self.bound, "<=": value <= self.bound,
               "<": value < self.bound}[self.op]
        shown = f"{number(value)}x" if self.versus is not None else number(value)
        return met, f"{'yes' if met else 'NO'} ({shown})"


@dataclass
class Workload:
    """One workload: its metrics, targets, the systems it compares, how to run it once."""

    name: str
    title: str
    metrics: list[Metric]
    targets: list[Target]
    systems: tuple[str, ...]
    measure: Callable[[System, Context], dict[str, float]]
    prepare: Callable[[Context], None] = field(default=lambda ctx: None)
    fresh_server_per_rep: bool = False
    reps: int = 5  # repetitions of a full run (sized so that `make bench` takes under 10 min)


# --- 1. PTY output -------------------------------------------------------------


def text_file(ctx: Context) -> Path:
    return Path(ctx.workdir) / "text.txt"


def make_text_file(ctx: Context) -> None:
    """A text file of printable lines (80 columns), ctx.sizes.pty_bytes long."""
    path = text_file(ctx)
    if path.exists() and path.stat().st_size == ctx.sizes.pty_bytes:
        return
    line = bytes(range(33, 112)) + b"\n"
    block = line * (1024 * 1024 // len(line))
    with open(path, "wb") as file:
        remaining = ctx.sizes.pty_bytes
        while remaining > 0:
            remaining -= file.write(block[:remaining])


def measure_pty_output(system: System, ctx: Context) -> dict[str, float]:
    result = system.stream(["cat", str(text_file(ctx))], pty=True, transport=ctx.transport)
    if result.nbytes < ctx.sizes.pty_bytes:
        raise RuntimeError(f"received {result.nbytes} of {ctx.sizes.pty_bytes} bytes")
    return {"mbps": result.nbytes / result.seconds / MB}


# --- 2. Pipe output ------------------------------------------------------------


def server_cpu(system: System) -> float | None:
    pids = system.cpu_pids()
    return sum(cpu_seconds(pid) for pid in pids) if pids else None


def measure_pipe_output(system: System, ctx: Context) -> dict[str, float]:
    size = ctx.sizes.pipe_bytes
    before = server_cpu(system)
    result = system.stream(["head", "-c", str(size), "/dev/zero"], pty=False,
                           transport=ctx.transport)
    after = server_cpu(system)
    if result.nbytes != size:
        raise RuntimeError(f"received {result.nbytes} of {size} bytes")
    values = {"mbps": result.nbytes / result.seconds / MB}
    if before is not None and after is not None:
        values["cpu_per_gb"] = (after - before) / (result.nbytes / GB)
    return values


# --- 3. Keystroke echo -----------------------------------------------------------


def measure_echo(system: System, ctx: Context) -> dict[str, float]:
    latencies = system.echo(ECHO_ARGV, ctx.sizes.echo_rounds, transport=ctx.transport)
    return {"p50_us": percentile(latencies, 50) * 1e6, "p99_us": percentile(latencies, 99) * 1e6}


FLOOD_ARGV = ["cat", "/dev/zero"]
# The flood's output is drained by `cat` to /dev/null; "flowing" says a whole first MB came
# (head alone exits 0 on a client that failed at once and sent nothing).
_DRAIN = ('{ [ "$(head -c 1000000 | wc -c)" -eq 1000000 ] && echo flowing'
          ' && exec cat >/dev/null; }')


def measure_echo_flood(system: System, ctx: Context) -> dict[str, float]:
    """Echo as `measure_echo`, while another session of the same server streams
    /dev/zero as fast as its client (a separate process) takes it."""
    with floods(system, ctx, 1):
        return measure_echo(system, ctx)


@contextlib.contextmanager
def floods(system: System, ctx: Context, count: int) -> Iterator[None]:
    """``count`` sessions of ``system`` flooding (`cat /dev/zero`, each drained by its own
    client process) while the block runs; RuntimeError if one did not start or ended."""
    command = shlex.join(system.exec_command(FLOOD_ARGV, ctx.transport)) + " | " + _DRAIN
    running: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for index in range(count):
            errors = Path(ctx.workdir) / f"flood{index}.stderr"
            with open(errors, "wb") as stderr:
                flood = subprocess.Popen(["sh", "-c", command], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=stderr,
                                         start_new_session=True)
            running.append((flood, errors))
            assert flood.stdout is not None
            if flood.stdout.readline() != b"flowing\n":
                raise RuntimeError(f"the flood did not start (exit {flood.wait()}): "
                                   f"{errors.read_text(errors='replace')[-300:]}")
        yield
        for flood, errors in running:
            if flood.poll() is not None:
                raise RuntimeError(f"a flood ended during the measure (exit "
                                   f"{flood.returncode}): "
                                   f"{errors.read_text(errors='replace')[-300:]}")
    finally:
        for flood, _ in running:
            kill_group(flood.pid)
            flood.wait()
            if flood.stdout is not None:
                flood.stdout.close()


# --- 3b. Every core (`serve --workers`) ----------------------------------------------


def client_counts() -> list[int]:
    """How many clients at once: 1, 4, 8 and 16 where the cores allow (2 where that is all
    this machine has)."""
    cores = len(os.sched_getaffinity(0))
    return [n for n in (1, 2, 4, 8, 16) if n <= cores and (n != 2 or cores < 4)]


def flood_counts() -> list[int]:
    """Sessions flooding beside the echo: 0, 3, 7 and 15 with 16 cores; fewer with fewer."""
    cores = len(os.sched_getaffinity(0))
    return [n for n in (0, 1, 3, 7, 15) if n < max(cores, 2) * 2 and (n != 1 or cores < 4)]


def in_processes(count: int, work: Callable[[], float]) -> list[float]:
    """``work`` in ``count`` forked processes at once; what each returned."""
    children = []
    for _ in range(count):
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its result, then out without the parent's clean-up
            code = 1
            try:
                os.close(reader)
                os.write(writer, repr(work()).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(writer)
        children.append((pid, reader))
    results = []
    for pid, reader in children:
        with os.fdopen(reader, "rb") as answer:
            said = answer.read()
        if procs.wait_status(pid) != 0 or not said:
            raise RuntimeError("a client process failed")
        results.append(float(said))
    return results


def measure_cores(system: System, ctx: Context) -> dict[str, float]:
    """N clients at once: sequential `true` sessions (a new connection each), and N pipe
    streams of `head -c SIZE /dev/zero`; the rate, the MB/s and the server's cores busy."""
    values: dict[str, float] = {}
    count, size = ctx.sizes.sessions, ctx.sizes.pipe_bytes // 2
    for n in client_counts():
        before, start = server_cpu(system), now()
        in_processes(n, lambda: system.sessions(["true"], count, "unix").seconds)
        elapsed = now() - start
        values[f"rate_{n}"] = n * count / elapsed
        if before is not None and (after := server_cpu(system)) is not None:
            values[f"cpu_rate_{n}"] = (after - before) / elapsed
        before, start = server_cpu(system), now()
        in_processes(n, lambda: system.exec_stream(
            ["head", "-c", str(size), "/dev/zero"], "unix").seconds)
        elapsed = now() - start
        values[f"mbps_{n}"] = n * size / elapsed / MB
        if before is not None and (after := server_cpu(system)) is not None:
            values[f"cpu_mbps_{n}"] = (after - before) / elapsed
    return values


def measure_echo_floods(system: System, ctx: Context) -> dict[str, float]:
    """The keystroke echo with 0, 3, 7, 15 other sessions of the server flooding."""
    values: dict[str, float] = {}
    for count in flood_counts():
        with floods(system, ctx, count):
            echo = measure_echo(system, ctx)
        values[f"p50_us_{count}"], values[f"p99_us_{count}"] = echo["p50_us"], echo["p99_us"]
    return values


# --- 4. Session rate -------------------------------------------------------------


def measure_session_rate(system: System, ctx: Context) -> dict[str, float]:
    values: dict[str, float] = {}
    for transport in ("unix", "tcp"):
        used: str | None = transport if transport in system.transports else None
        if used is None and system.transports == ("local",):
            used = "local"
        if used is None:
            continue
        if used == "local" and values:
            values[f"rate_{transport}"] = values["rate_unix"]
            values[f"p50_ms_{transport}"] = values["p50_ms_unix"]
            continue
        run = system.sessions(["true"], ctx.sizes.sessions, transport=used)
        values[f"rate_{transport}"] = len(run.latencies) / run.seconds
        values[f"p50_ms_{transport}"] = percentile(run.latencies, 50) * 1e3
    for key, transport in (("mux", "unix"), ("stdio", "stdio")):
        if system.transports == ("local",):  # no connection at all: the same yardstick
            values[f"rate_{key}"] = values["rate_unix"]
            continue
        try:
            run = system.sessions_one_connection(["true"], ctx.sizes.sessions, transport)
        except NotApplicable:
            continue
        values[f"rate_{key}"] = len(run.latencies) / run.seconds
    return values


# --- 5. Scale ----------------------------------------------------------------------


def settled_usage(system: System, quiet: float = 1.0, timeout: float = 20.0) -> Usage | None:
    """The server's usage once its descriptor count has not changed for ``quiet`` seconds."""
    usage = system.usage()
    if usage is None:
        return None
    deadline = time.monotonic() + timeout
    since = time.monotonic()
    while time.monotonic() - since < quiet and time.monotonic() < deadline:
        time.sleep(0.05)
        current = system.usage()
        assert current is not None
        if current.fds != usage.fds:
            since = time.monotonic()
        usage = current
    return usage


def measure_scale(system: System, ctx: Context) -> dict[str, float]:
    count = ctx.sizes.scale_sessions
    system.scale(ECHO_ARGV, 1, 1, probe=lambda: None, transport=ctx.transport)  # warm up
    base = settled_usage(system)
    run = system.scale(ECHO_ARGV, count, ctx.sizes.scale_rounds, probe=system.usage,
                       transport=ctx.transport)
    values = _scale_values(run, base, count)
    if run.usage is not None:
        values["fds"] = run.usage.fds
        if base is None:
            values["fds_per_session"] = run.usage.fds / count
        elif (after := settled_usage(system)) is not None:
            values["fds_left"] = after.fds - base.fds
    return values


def _scale_values(run: ScaleRun, base: Usage | None, count: int) -> dict[str, float]:
    """What every scale run reports: opens/s, the last session's echo, and the server's
    growth per session over ``base`` (the idle server)."""
    values = {"open_rate": count / run.open_seconds,
              "echo_p50_ms": percentile(run.latencies, 50) * 1e3,
              "echo_p99_ms": percentile(run.latencies, 99) * 1e3}
    if run.usage is not None and base is not None:
        values["fds_per_session"] = (run.usage.fds - base.fds) / count
        if run.usage.rss_kib is not None and base.rss_kib is not None:
            values["rss_kib_per_session"] = (run.usage.rss_kib - base.rss_kib) / count
    return values


# --- 6. Client cost ------------------------------------------------------------------


def measure_client_cost(system: System, ctx: Context) -> dict[str, float]:
    size = ctx.sizes.exec_bytes
    run = system.exec_stream(["head", "-c", str(size), "/dev/zero"], transport=ctx.transport)
    values = {"mbps": size / run.seconds / MB}
    if run.client_cpu is not None:
        values["client_cpu_per_gb"] = run.client_cpu / (size / GB)
    values["startup_ms"] = system.exec_stream(["true"], transport=ctx.transport).seconds * 1e3
    return values


# --- 5b. Scale, pipe sessions on multiplexed connections ------------------------------


def measure_scale_pipes(system: System, ctx: Context) -> dict[str, float]:
    connections, per_connection = ctx.sizes.pipe_connections, ctx.sizes.pipe_per_connection
    count = connections * per_connection
    system.scale_pipes(1, 1, 1, probe=lambda: None)  # warm up
    base = settled_usage(system)
    run = system.scale_pipes(connections, per_connection, ctx.sizes.scale_rounds,
                             probe=system.usage)
    return _scale_values(run, base, count)


# --- 7. Start-up -----------------------------------------------------------------------

STARTUP_RUNS = 7  # per repetition; the median is kept


def median_ms(start: Callable[[], float]) -> float:
    """The median of STARTUP_RUNS calls of ``start`` (seconds each), in ms."""
    return median([start() for _ in range(STARTUP_RUNS)]) * 1e3


def measure_startup(system: System, ctx: Context) -> dict[str, float]:
    """Cold (TTYSERVE_WARM=0, as every run has it), and for the CLI, with a warm server
    running (ttyserve/cli/warm.py: what a script's second `exec` finds)."""
    transport = "unix" if "unix" in system.transports else ctx.transport
    values = {"wall_ms": median_ms(lambda: system.startup(transport))}
    if system.warm_starts:
        with warm_far_side(ctx.workdir) as runtime:
            values["warm_ms"] = median_ms(lambda: system.warm_startup(transport, runtime))
    return values


# --- 8. Fan-out ------------------------------------------------------------------------


def measure_fanout(system: System, ctx: Context) -> dict[str, float]:
    targets = ctx.sizes.fanout_targets
    return {"wall_s": system.fanout(targets, FANOUT_PARALLEL)}


FANOUT_PARALLEL = 32


def measure_fanout_ssh(system: System, ctx: Context) -> dict[str, float]:
    """With a warm far side on the (one, loopback) host, and with none."""
    targets = ctx.sizes.ssh_targets
    return {"wall_s": system.fanout(targets, FANOUT_PARALLEL, over="ssh", warm=True),
            "cold_s": system.fanout(targets, FANOUT_PARALLEL, over="ssh")}


def measure_one_target(system: System, ctx: Context) -> dict[str, float]:
    """`true` on one host through a loopback sshd started for the repetition (not timed),
    with a warm server there (reached by the client and the far side alike) and with none."""
    from .fanout import loopback_sshd

    values: dict[str, float] = {}
    for key, warm in (("wall_ms", True), ("cold_ms", False)):
        with tempfile.TemporaryDirectory(dir=ctx.workdir) as directory, \
                loopback_sshd(Path(directory), warm) as loopback:
            values[key] = median_ms(lambda: system.one_target(["true"], loopback))
    return values


def measure_stdio_start(system: System, ctx: Context) -> dict[str, float]:
    """With a warm far side running (as on a host a first connection started it), with
    none (TTYSERVE_WARM=0: every start imports everything), and `--persist` relayed to the
    server answering on the default socket (a carrier's reconnect)."""
    cold = median_ms(system.stdio_start)
    relay = median_ms(system.relay_start)
    with warm_far_side(ctx.workdir) as runtime:
        return {"wall_ms": median_ms(lambda: system.stdio_start(runtime)), "cold_ms": cold,
                "relay_ms": relay}


# --- 9. Reattach -----------------------------------------------------------------------

RING = 1 << 20  # the default --scrollback


def measure_reattach(system: System, ctx: Context) -> dict[str, float]:
    seconds, replayed = system.reattach(RING)
    return {"reattach_ms": seconds * 1e3, "replay_mbps": replayed / seconds / MB}


# --- 10. Resume (section 10) -------------------------------------------------------------


def colored_file(ctx: Context) -> Path:
    return Path(ctx.workdir) / "colored.txt"


def make_colored_file(ctx: Context) -> None:
    """Terminal output as programs write it: lines with colour sequences and, now and then,
    a title, a cursor mode or a screen switch: what the mode tracker reads."""
    path = colored_file(ctx)
    size = ctx.sizes.pty_bytes // 4
    if path.exists() and path.stat().st_size == size:
        return
    lines = [b"\x1b[1;34mdrwxr-xr-x\x1b[0m  2 user user 4096 \x1b[32m%05d\x1b[0m name\n" % n
             for n in range(1000)]
    lines[500] = b"\x1b]2;a title\x07\x1b[?1h\x1b=\x1b[?2004h" + lines[500]
    lines[999] = b"\x1b[?2004l\x1b[?1l\x1b>" + lines[999]
    block = b"".join(lines)
    with open(path, "wb") as file:
        remaining = size
        while remaining > 0:
            remaining -= file.write(block[:remaining])


def measure_tracking(system: System, ctx: Context) -> dict[str, float]:
    size = colored_file(ctx).stat().st_size
    result = system.stream(["cat", str(colored_file(ctx))], pty=True, transport="unix")
    if result.nbytes < size:
        raise RuntimeError(f"received {result.nbytes} of {size} bytes")
    latencies = system.echo(ECHO_ARGV, ctx.sizes.echo_rounds, transport="unix")
    return {"mbps": result.nbytes / result.seconds / MB,
            "p50_us": percentile(latencies, 50) * 1e6, "p99_us": percentile(latencies, 99) * 1e6}


RESUME_CUT = 1 << 20  # the stream of the resume row is cut after its first MiB,
RESUME_TOTAL = RESUME_CUT + (900 << 10)  # and what follows fits the default 1 MiB ring


def measure_resume(system: System, ctx: Context) -> dict[str, float]:
    resume = getattr(system, "resume_after_cut", None)
    if resume is None:
        raise NotApplicable
    first, last, after, lost = resume(RESUME_TOTAL, RESUME_CUT)
    return {"first_byte_ms": first * 1e3, "replay_ms": last * 1e3, "after_kib": after / 1024,
            "lost_kib": lost / 1024}


PEERS = ("raw", "ttyserve", "ttyserve-lib", "ttyserve-ws", "asyncssh", "openssh", "pdsh")
HTTP = "ttyserve-http"  # section 13's API: pipe output (beside ttyserve-ws) and start-up
# The rows one client makes, where `--workers auto` (ttyserve's default) must not be worse
# than one process (ttyserve-w1).
ONE_CLIENT = ("raw", "ttyserve", "ttyserve-w1", *PEERS[2:])
ALL_SYSTEMS = (*PEERS, HTTP, "ttyserve-resume",  # (compared only with ttyserve-lib)
               "ttyserve-w1",  # (one process: beside `ttyserve`, whose default is auto)
               "raw-cgroup", "ttyserve-nocg",  # (containment's cost: with raw and ttyserve)
               "ttyserve-unobserved", "ttyserve-observed",  # (observers' cost: each other)
               "ttyserve-stalled",
               "ttyserve-door", "ttyserve-carrier",  # (the door's cost: each other)
               "ttyserve-modes")  # (section 14's cost: beside ttyserve-lib)

WORKLOADS = [
    Workload(
        "pty_output", "PTY output: cat of a text file under a PTY",
        [Metric("mbps", "MB/s", True)],
        [Target("mbps", ">=", 0.9, "raw"),
         Target("mbps", ">=", 0.8, "ttyserve-lib", system="ttyserve-ws")],
        ONE_CLIENT, measure_pty_output, prepare=make_text_file),
    Workload(
        "pipe_output", "Pipe output: head -c SIZE /dev/zero in pipe mode",
        [Metric("mbps", "MB/s", True), Metric("cpu_per_gb", "server CPU s/GB")],
        [Target("mbps", ">=", 0.4, "raw"), Target("mbps", ">=", 10, "asyncssh"),
         Target("mbps", ">=", 0.8, "ttyserve-lib", system="ttyserve-ws")],
        (*ONE_CLIENT, HTTP), measure_pipe_output),
    Workload(
        "echo", "Keystroke echo: 1-byte writes to cat under a raw PTY",
        [Metric("p50_us", "p50 us"), Metric("p99_us", "p99 us")],
        [Target("p50_us", "<=", 0.3, "asyncssh"), Target("p50_us", "<", 1, "openssh"),
         Target("p50_us", "<=", 2.5, "raw"), Target("p99_us", "<=", 0.5, "asyncssh"),
         Target("p99_us", "<", 1, "openssh"),
         Target("p50_us", "<=", 1.3, "ttyserve-lib", system="ttyserve-ws")],
        ONE_CLIENT, measure_echo),
    Workload(
        "echo_flood", "Keystroke echo while another session of the same server floods output",
        [Metric("p50_us", "p50 us"), Metric("p99_us", "p99 us")],
        [Target("p99_us", "<=", 0.5, "asyncssh"), Target("p99_us", "<", 1, "openssh")],
        ("raw", "ttyserve", "ttyserve-w1", "asyncssh", "openssh"), measure_echo_flood),
    Workload(
        "session_rate", "Session rate: sequential `true` sessions, a new connection each",
        [Metric("rate_unix", "sessions/s unix", True), Metric("p50_ms_unix", "p50 ms unix"),
         Metric("rate_tcp", "sessions/s tcp", True), Metric("p50_ms_tcp", "p50 ms tcp"),
         Metric("rate_mux", "sessions/s, one multiplexed unix connection", True),
         Metric("rate_stdio", "sessions/s, one serve --stdio connection", True)],
        [Target("rate_unix", ">=", 0.6, "raw"), Target("rate_tcp", ">=", 0.6, "raw"),
         Target("rate_mux", ">=", 0.75, "raw"),
         Target("rate_tcp", ">=", 4, "asyncssh")],
        ONE_CLIENT, measure_session_rate),
    Workload(
        "scale", "Scale: N concurrent PTY sessions on one server",
        [Metric("rss_kib_per_session", "server RSS KiB/session"), Metric("fds", "server fds"),
         Metric("fds_per_session", "fds/session"), Metric("fds_left", "fds left after close"),
         Metric("echo_p50_ms", "last echo p50 ms"), Metric("echo_p99_ms", "last echo p99 ms"),
         Metric("open_rate", "opens/s", True)],
        [Target("rss_kib_per_session", "<=", 20), Target("echo_p50_ms", "<", 20)],
        # Not OpenSSH: a client and two sshd processes per session, 1,000 do not open in 90 s.
        ("raw", "ttyserve", "ttyserve-w1", "asyncssh"), measure_scale, fresh_server_per_rep=True,
        reps=3),
    Workload(
        "scale_pipes", "Scale: `cat` sessions in pipe mode on multiplexed connections "
                       "(40 x 100; 4 x 10 with --quick)",
        [Metric("rss_kib_per_session", "server RSS KiB/session"),
         Metric("fds_per_session", "fds/session"),
         Metric("echo_p50_ms", "last line echo p50 ms"),
         Metric("echo_p99_ms", "last line echo p99 ms"),
         Metric("open_rate", "opens/s", True)],
        [Target("rss_kib_per_session", "<=", 20, system="ttyserve-lib"),
         Target("echo_p50_ms", "<", 20, system="ttyserve-lib")],
        ("ttyserve-lib",), measure_scale_pipes, fresh_server_per_rep=True, reps=3),
    Workload(
        "client_cost", "Client cost: a CLI client streaming head -c SIZE /dev/zero to /dev/null",
        [Metric("mbps", "MB/s", True), Metric("client_cpu_per_gb", "client CPU s/GB"),
         Metric("startup_ms", "ms to run `true`")],
        [Target("mbps", ">=", 0.4, "raw")],
        ("raw", "ttyserve", "asyncssh", "openssh"), measure_client_cost, reps=3),
    Workload(
        "startup", "Start-up: a client runs `true` end to end (raw: python -c pass)",
        [Metric("wall_ms", "ms, median of 7"),
         Metric("warm_ms", "ms, median of 7, a warm server running")],
        [Target("wall_ms", "<=", 60), Target("wall_ms", "<=", 2.5, "raw"),
         Target("warm_ms", "<=", 4, "raw")],
        ("raw", "ttyserve", "ttyserve-lib", HTTP, "asyncssh", "openssh"), measure_startup),
    Workload(
        "fanout", f"Fan-out: `uname -n` on N local serve --stdio targets, {FANOUT_PARALLEL} "
                  "at once (pdsh: its exec module)",
        [Metric("wall_s", "wall s")],
        [],
        ("ttyserve", "pdsh"), measure_fanout, reps=3),
    Workload(
        "fanout_ssh", f"Fan-out over real ssh: `uname -n` on N aliases of a loopback sshd, "
                      f"{FANOUT_PARALLEL} at once, the same ssh options for both (ttyserve: "
                      "`via:ssh -F CONFIG hostNNN`; pdsh: its ssh module)",
        [Metric("wall_s", "wall s, a warm far side running"),
         Metric("cold_s", "wall s, none (TTYSERVE_WARM=0)")],
        [Target("wall_s", "<=", 1.0, "pdsh"), Target("cold_s", "<=", 1.5, "pdsh")],
        ("ttyserve", "pdsh"), measure_fanout_ssh, reps=3),
    Workload(
        "one_target", "One target over real ssh: `true` through a loopback sshd (ttyserve: "
                      "exec --connect via:ssh; openssh: ssh host true)",
        [Metric("wall_ms", "ms, median of 7, a warm far side running"),
         Metric("cold_ms", "ms, median of 7, none (TTYSERVE_WARM=0)")],
        [Target("wall_ms", "<=", 1.2, "openssh")],
        ("ttyserve", "openssh"), measure_one_target),
    Workload(
        "stdio_start", "The far side's start: `serve --stdio` on a socket pair, `hello` and "
                       "`open true` sent at once, to its `exit` (raw: python -c pass)",
        [Metric("wall_ms", "ms, median of 7, a warm far side running"),
         Metric("cold_ms", "ms, median of 7, none (TTYSERVE_WARM=0)"),
         Metric("relay_ms", "ms, median of 7, --persist: relayed to the server running")],
        [Target("wall_ms", "<=", 2, "raw"), Target("cold_ms", "<=", 4, "raw")],
        ("raw", "ttyserve"), measure_stdio_start),
    Workload(
        "reattach", "Reattach: attach to a detached session with a full 1 MiB ring",
        [Metric("reattach_ms", "ms to the last replayed byte"),
         Metric("replay_mbps", "replay MB/s", True)],
        [Target("reattach_ms", "<", 20, system="ttyserve-lib")],
        ("ttyserve-lib",), measure_reattach),
    Workload(
        "tracking", "Resume's cost: coloured PTY output and echo, a plain session against one "
                    "spawned with resume (ring, offsets, mode tracker, heartbeat)",
        [Metric("mbps", "MB/s", True), Metric("p50_us", "echo p50 us"),
         Metric("p99_us", "echo p99 us")],
        [Target("mbps", ">=", 0.9, "ttyserve-lib", system="ttyserve-resume"),
         Target("p50_us", "<=", 1.1, "ttyserve-lib", system="ttyserve-resume")],
        ("ttyserve-lib", "ttyserve-resume"), measure_tracking, prepare=make_colored_file),
    Workload(
        "resume", "Resume: a 1.9 MiB stream whose connection is cut after 1 MiB (unix socket)",
        [Metric("first_byte_ms", "ms from the cut to the first byte after it"),
         Metric("replay_ms", "ms from the cut to the last byte"),
         Metric("after_kib", "KiB after the resume (the replay)"),
         Metric("lost_kib", "KiB lost (the ring's overrun)")],
        [Target("first_byte_ms", "<", 200, system="ttyserve-resume")],
        ("ttyserve-resume",), measure_resume),
]

WORKLOADS.append(Workload(
    "cores", "Every core: N clients at once, each running sequential `true` sessions (a new "
             "connection each), then each streaming `head -c SIZE/2 /dev/zero` in pipe mode "
             "(raw: N local spawn loops, N local pipes); ttyserve as `--workers auto` and 1",
    [m for n in client_counts() for m in (
        Metric(f"rate_{n}", f"sessions/s, {n} clients", True),
        Metric(f"cpu_rate_{n}", f"server cores busy, {n} clients' sessions"),
        Metric(f"mbps_{n}", f"MB/s, {n} streams", True),
        Metric(f"cpu_mbps_{n}", f"server cores busy, {n} streams"))],
    [Target(f"rate_{client_counts()[-1]}", ">=", 0.5, "raw"),
     Target(f"mbps_{client_counts()[-1]}", ">=", 0.6, "raw")],
    ("raw", "ttyserve", "ttyserve-w1"), measure_cores, reps=3))

WORKLOADS.append(Workload(
    "echo_floods", "Keystroke echo through `cat` with 0, 3, 7, 15 other sessions of the server "
                   "flooding (`cat /dev/zero`, each drained by its own client process; raw: "
                   "local floods); ttyserve as `--workers auto` and 1",
    [m for n in flood_counts() for m in (
        Metric(f"p50_us_{n}", f"p50 us, {n} flooding"),
        Metric(f"p99_us_{n}", f"p99 us, {n} flooding"))],
    [Target(f"p99_us_{flood_counts()[-1]}", "<=", 1, "openssh")],
    ("raw", "ttyserve", "ttyserve-w1", "openssh"), measure_echo_floods, reps=3))

WORKLOADS.append(Workload(
    "containment", "Containment's cost: sequential `true` sessions with --cgroup auto (ttyserve) "
                   "and off (ttyserve-nocg); a bare spawn entering a cgroup (raw-cgroup) and not",
    [Metric("rate_unix", "sessions/s unix", True), Metric("p50_ms_unix", "p50 ms unix"),
     Metric("rate_mux", "sessions/s, one multiplexed unix connection", True)],
    [Target("rate_unix", ">=", 0.8, "ttyserve-nocg", system="ttyserve")],
    ("raw", "raw-cgroup", "ttyserve", "ttyserve-nocg"), measure_session_rate))



def measure_observed(system: System, ctx: Context) -> dict[str, float]:
    """The writer's pipe output and echo, with the system's observers watching."""
    return {**measure_pipe_output(system, ctx), **measure_echo(system, ctx)}


WORKLOADS.append(Workload(
    "observers", "Observers' cost (section 11): a detachable session's pipe output and echo, "
                 "as its writer sees them, with no observer (unobserved), 10 reading "
                 "everything in another process (observed), and 10 that never read "
                 "(stalled)",
    [Metric("mbps", "MB/s", True), Metric("cpu_per_gb", "server CPU s/GB"),
     Metric("p50_us", "echo p50 us"), Metric("p99_us", "echo p99 us")],
    [Target("mbps", ">=", 0.8, "ttyserve-unobserved", system="ttyserve-stalled")],
    ("ttyserve-unobserved", "ttyserve-observed", "ttyserve-stalled"), measure_observed))



WORKLOADS.append(Workload(
    "modes", "The terminal's state (section 14): coloured PTY output and echo, sessions that "
             "ask for `modes` against the same sessions that do not",
    [Metric("mbps", "MB/s", True), Metric("p50_us", "echo p50 us"),
     Metric("p99_us", "echo p99 us")],
    [Target("mbps", ">=", 0.9, "ttyserve-lib", system="ttyserve-modes"),
     Target("p50_us", "<=", 1.1, "ttyserve-lib", system="ttyserve-modes")],
    ("ttyserve-lib", "ttyserve-modes"), measure_tracking, prepare=make_colored_file))


def measure_door(system: System, ctx: Context) -> dict[str, float]:
    """Sequential `true` sessions on one connection whose carrier is up, and a pipe stream
    of a quarter of the pipe size: through the door or over the carrier directly."""
    run = system.sessions_one_connection(["true"], ctx.sizes.sessions, "unix")
    size = ctx.sizes.pipe_bytes // 4
    moved = system.stream(["head", "-c", str(size), "/dev/zero"], False, "unix")
    if moved.nbytes != size:
        raise RuntimeError(f"received {moved.nbytes} of {size} bytes")
    return {"start_ms": percentile(run.latencies, 50) * 1e3,
            "mbps": moved.nbytes / moved.seconds / MB}


WORKLOADS.append(Workload(
    "door", "The door (section 15): sessions on a target through `serve --targets` against "
            "the same carrier (`via:env` to `serve --stdio --persist`) run by the client, "
            "each connection's carrier up: open to exit of `true`, and pipe output",
    [Metric("start_ms", "open to exit p50 ms"), Metric("mbps", "MB/s", True)],
    [Target("start_ms", "<=", 1.2, "ttyserve-carrier", system="ttyserve-door"),
     Target("mbps", ">=", 0.7, "ttyserve-carrier", system="ttyserve-door")],
    ("ttyserve-door", "ttyserve-carrier"), measure_door, reps=3))

BY_NAME = {workload.name: workload for workload in WORKLOADS}

