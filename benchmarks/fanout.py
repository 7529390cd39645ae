"""Fan-out to many simulated targets: `ttyserve exec --hosts` next to `pdsh -R exec`.

    python -m benchmarks.fanout [--targets 500] [--parallel 32 | --parallel-all]
                                [--rounds 3] [--command 'uname -n']

Each target is simulated on this machine. For ttyserve it is a line
`via:env SIM=hostNNN` of a hosts file, so the client runs the carrier
`env SIM=hostNNN TTYSERVE serve --stdio` (a local far side speaking the protocol
on its pipes) and that far side runs COMMAND. For pdsh it is `hostNNN` in
`-w host[001-N]`, and pdsh's `exec` module runs COMMAND locally for it. Both
run at most P targets at once (`--parallel P`, `-f P`). pdsh gets `-S`, so
that its exit status is, like ttyserve's, the highest of the targets'.

Every far side runs on this machine, so the wall time and the descendants' CPU
are mostly the simulated far sides' start-up (one Python process each, ~0.16 s
of CPU here): work that real hosts do on their own CPUs. The client's own CPU,
memory and descriptors are the numbers that carry over to a real fleet.
`--parallel-all` at 500 targets holds 500 far sides at once (~20 MiB each).

The two tools alternate (ttyserve, pdsh, ttyserve, pdsh, ...), `--rounds`
times each. Every run is checked: exit status 0, and on stdout exactly the
lines COMMAND prints locally, once per target, each prefixed with its target;
anything else fails the benchmark and keeps the run's files.

What each number means (the client is the `ttyserve exec` or `pdsh` process;
its children are the carriers for ttyserve, which here are also the simulated
far sides since `env` execs ttyserve, and the commands for pdsh):

- wall: from spawning the client to its exit (a thread blocked in waitid).
- client CPU: the client's own utime+stime, read from /proc/PID/stat once it
  has exited but before it is reaped (waitid WNOWAIT), so the whole run is
  counted and none of its children.
- descendants' CPU: cutime+cstime from the same read: every descendant that
  was waited for, transitively. For ttyserve: the carriers and far sides and
  the commands they ran; for pdsh: the commands.
- cores busy: (client + descendants' CPU) / wall; 2.0 is every core of this
  machine, if nothing else runs on it.
- client peak RSS: the client's VmHWM (/proc/PID/status), sampled; a high-water
  mark, so only growth after the last sample is missed.
- largest child's peak RSS: the largest VmHWM of a child, each child's last
  sample. A child that lives less than one sample interval (pdsh's commands)
  is often not seen at all.
- children's RSS at once: the largest sum of the children's VmRSS in one sample.
- client peak descriptors: entries of /proc/PID/fd, sampled.
- peak running targets: the client's live children (/proc/PID/task/*/children,
  pdsh forks from many threads), sampled.
- descriptors per running target: peak descriptors / peak running targets. It
  includes the client's fixed descriptors, which matter less as P grows:
  `--parallel-all` (P = N) is the run that shows the per-target cost.

Samples are taken every 20 ms, less often when there are so many children that
reading them would take more than ~10% of a core. A run shorter than a few
samples (pdsh at small N) has coarse peaks. CPU times come in clock ticks
(10 ms). The sampler runs in this process and takes a little CPU from the
clients it measures.

wait4's ru_maxrss is not used: Linux records the address space a process
leaves at exec in that process's maxrss, and a child spawned from this Python
process leaves this process's memory, so ru_maxrss is at least this process's
own peak RSS (~15-20 MiB), more than pdsh and its commands use.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .procs import CLK_TCK, raise_nofile_limit
from .server import far_side_environment, ttyserve_script, warm_far_side
from .stats import Summary, cell, median, number, render_table

SAMPLE_EVERY = 0.02  # seconds between /proc samples of the client
FDS_PER_TARGET = 6  # a generous guess at the client's descriptors per running target
FD_HEADROOM = 64  # the client's own descriptors besides its targets
MIB = 1024  # KiB in a MiB
FAR_SIDE_MIB = 20  # private memory of one `serve --stdio` far side (17.7 MiB anon measured)
TOOLS = ("ttyserve", "pdsh")
TARGET = re.compile(rb"^(?:via:env SIM=|via:ssh -F \S+ )?(host\d+): ")


def say(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


class BenchmarkFailed(Exception):
    """A run did not do what it should: the message says what and where its files are."""


# --- one measured run ----------------------------------------------------------------


@dataclass
class Peaks:
    """What the sampler saw of the client and its children while they ran."""

    hwm_kib: int = 0
    fds: int = 0
    children: int = 0
    threads: int = 0
    children_rss_kib: int = 0  # the largest sum of the children's VmRSS in one sample
    child_hwm_kib: dict[int, int] = field(default_factory=dict)  # each child's last VmHWM
    samples: int = 0

    def sample(self, pid: int) -> None:
        """One look at /proc; a process that is ending may lose any file: skip it."""
        status = read_status(pid)
        self.hwm_kib = max(self.hwm_kib, status.get("VmHWM", 0))
        self.threads = max(self.threads, status.get("Threads", 0))
        with contextlib.suppress(OSError):
            self.fds = max(self.fds, len(os.listdir(f"/proc/{pid}/fd")))
        children = list_children(pid)
        self.children = max(self.children, len(children))
        total = 0
        for child in children:
            child_status = read_status(child)
            total += child_status.get("VmRSS", 0)
            if "VmHWM" in child_status:
                self.child_hwm_kib[child] = child_status["VmHWM"]
        self.children_rss_kib = max(self.children_rss_kib, total)
        self.samples += 1


def read_status(pid: int) -> dict[str, int]:
    """VmHWM, VmRSS (KiB) and Threads from /proc/PID/status; what is there of them."""
    found: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError, IndexError), \
            open(f"/proc/{pid}/status", encoding="ascii") as file:
        for line in file:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "Threads"):
                found[key] = int(value.split()[0])
    return found


def list_children(pid: int) -> list[int]:
    """The live children of every thread of ``pid`` (a thread's children are its own)."""
    children: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError), \
                    open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as file:
                children.extend(int(child) for child in file.read().split())
    return children


@dataclass
class Run:
    """One run of one tool, measured (see the module's docstring for each number)."""

    status: int
    wall: float
    client_cpu: float
    descendants_cpu: float
    peaks: Peaks

    def metrics(self, targets: int) -> dict[str, float]:
        peaks = self.peaks
        values = {
            "wall_s": self.wall,
            "targets_per_s": targets / self.wall,
            "client_cpu_s": self.client_cpu,
            "client_cpu_ms_per_target": self.client_cpu / targets * 1e3,
            "descendants_cpu_s": self.descendants_cpu,
            "descendants_cpu_ms_per_target": self.descendants_cpu / targets * 1e3,
            "cores_busy": (self.client_cpu + self.descendants_cpu) / self.wall,
            "client_hwm_mib": peaks.hwm_kib / MIB,
            "client_fds": float(peaks.fds),
            "running": float(peaks.children),
            "client_threads": float(peaks.threads),
        }
        if peaks.children:
            values["fds_per_running"] = peaks.fds / peaks.children
        if peaks.child_hwm_kib:
            values["child_hwm_mib"] = max(peaks.child_hwm_kib.values()) / MIB
            values["children_rss_mib"] = peaks.children_rss_kib / MIB
        return values


def zombie_cpu(pid: int) -> tuple[float, float]:
    """(own utime+stime, reaped descendants' cutime+cstime) of an exited, unreaped pid."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as file:
        text = file.read()
    fields = text[text.rindex(")") + 2:].split()  # from the 3rd field (state) on
    utime, stime, cutime, cstime = (int(value) for value in fields[11:15])
    return (utime + stime) / CLK_TCK, (cutime + cstime) / CLK_TCK


def measure(argv: list[str], stdout: Path, stderr: Path, timeout: float,
            env: dict[str, str] | None = None) -> Run:
    """Run ``argv`` (stdin /dev/null, output to files) in its own process group; sample it
    until it exits; read its CPU while it is a zombie, then reap it."""
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, str(stdout), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
        (os.POSIX_SPAWN_OPEN, 2, str(stderr), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
    ]
    exited = threading.Event()
    ended_at: list[float] = []

    began = time.monotonic()
    pid = os.posix_spawnp(argv[0], argv, dict(os.environ) if env is None else env,
                          file_actions=actions, setpgroup=0)

    def wait_for_exit() -> None:  # leaves the zombie in place (WNOWAIT) for zombie_cpu
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        ended_at.append(time.monotonic())
        exited.set()

    threading.Thread(target=wait_for_exit, daemon=True).start()
    peaks = Peaks()
    pause = SAMPLE_EVERY
    try:
        while not exited.wait(pause):
            sampled_at = time.monotonic()
            peaks.sample(pid)
            # at most ~10% of a core on sampling, however many children there are to read
            pause = max(SAMPLE_EVERY, 9 * (time.monotonic() - sampled_at))
            if time.monotonic() - began > timeout:
                raise BenchmarkFailed(f"{argv[0]} did not finish within {timeout:.0f} s")
        own, descendants = zombie_cpu(pid)
    except BaseException:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        raise
    _, status = os.waitpid(pid, 0)
    return Run(os.waitstatus_to_exitcode(status), ended_at[0] - began, own, descendants, peaks)


# --- the two tools ---------------------------------------------------------------------


@dataclass
class Setup:
    """Everything the runs of one invocation share."""

    workdir: Path
    targets: int
    parallel: int
    command: list[str]
    ttyserve: str
    pdsh: str | None
    expected: list[bytes]  # the lines the command prints locally, per target
    loopback: Loopback | None = None  # over a loopback sshd
    hosts_file: Path = field(init=False)

    def __post_init__(self) -> None:
        self.hosts_file = self.workdir / "hosts"
        self.hosts_file.write_text("".join(f"{self.address(host)}\n" for host in self.hosts()))

    def address(self, host: str) -> str:
        """ttyserve's address of ``host``: a simulated far side, or ssh to the loopback sshd."""
        if self.loopback is None:
            return f"via:env SIM={host}"
        return f"via:ssh -F {self.loopback.config} {host}"

    def environment(self) -> dict[str, str]:
        """pdsh's ssh module takes the same client configuration as ttyserve's carriers;
        ttyserve's client starts warm where its far sides do."""
        if self.loopback is None:  # (local far sides: never a warm one, as in round 2)
            return {**os.environ, **far_side_environment(None)}
        return {**os.environ, **far_side_environment(self.loopback.runtime),
                "PDSH_SSH_ARGS": f"-F {self.loopback.config} %h"}

    def width(self) -> int:
        return len(str(self.targets)) if self.targets >= 1000 else 3

    def hosts(self) -> list[str]:
        return [f"host{index:0{self.width()}d}" for index in range(1, self.targets + 1)]

    def argv(self, tool: str) -> list[str]:
        if tool == "ttyserve":
            return [self.ttyserve, "exec", "--hosts", str(self.hosts_file),
                    "--parallel", str(self.parallel), "--remote-command", self.ttyserve,
                    "--", *self.command]
        assert self.pdsh is not None
        last = f"{self.targets:0{self.width()}d}"
        module = "exec" if self.loopback is None else "ssh"
        return [self.pdsh, "-S", "-R", module, "-f", str(self.parallel),
                "-w", f"host[{1:0{self.width()}d}-{last}]", *self.command]


def check(setup: Setup, tool: str, run: Run, stdout: Path, stderr: Path) -> None:
    """Every target answered with the command's local output, and nothing failed."""
    problems: list[str] = []
    if run.status != 0:
        problems.append(f"exit status {run.status}")
    hosts = setup.hosts()
    seen: Counter[bytes] = Counter()
    strays: list[bytes] = []
    for line in stdout.read_bytes().splitlines():
        match = TARGET.match(line)
        if match is None:
            strays.append(line)
        else:
            seen[match.group(1) + b": " + line[match.end():]] += 1
    want = Counter(f"{host}: ".encode() + line for host in hosts for line in setup.expected)
    total = sum(seen.values())
    if strays:
        problems.append(f"{len(strays)} stdout lines without a target, e.g. {strays[0]!r}")
    if seen != want:
        missing = sorted((want - seen).elements())
        extra = sorted((seen - want).elements())
        problems.append(f"{total} target lines on stdout, {sum(want.values())} expected"
                        + (f"; missing e.g. {missing[0]!r}" if missing else "")
                        + (f"; unexpected e.g. {extra[0]!r}" if extra else ""))
    errors = stderr.read_bytes().splitlines()
    if tool == "ttyserve":
        ours = [line for line in errors if line.startswith(b"ttyserve: via:")]
        good = sum(line.endswith(b": exit 0") for line in ours)
        if good != setup.targets:
            problems.append(f"{good} of {setup.targets} summary lines say `exit 0`"
                            + (f", e.g. {bad[0]!r}" if (bad := [line for line in ours
                               if not line.endswith(b": exit 0")]) else ""))
        others = [line for line in errors if not line.startswith(b"ttyserve: via:")]
    else:
        others = errors
    if others:
        problems.append(f"{len(others)} other stderr lines, e.g. {others[0]!r}")
    if problems:
        raise BenchmarkFailed(f"{tool}: " + "; ".join(problems)
                              + f" (output: {stdout}, {stderr})")


# --- context: the machine, the limits, one target alone ---------------------------------


def pdsh_version(pdsh: str | None) -> str:
    if pdsh is None:
        return "not installed"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run([pdsh, "-V"], capture_output=True, text=True, timeout=10)
        return (done.stdout + done.stderr).splitlines()[0].strip()
    return "unknown"


def pids_limit() -> str:
    """The pids cgroup's limit on this process (v2, or v1's pids controller), and the
    kernel's pid_max and threads-max."""
    limit = "none found"
    with contextlib.suppress(OSError), open("/proc/self/cgroup", encoding="utf-8") as file:
        for line in file.read().splitlines():
            _, controllers, path = line.split(":", 2)
            root = ("/sys/fs/cgroup" if controllers == "" else
                    "/sys/fs/cgroup/pids" if "pids" in controllers.split(",") else None)
            if root is None:
                continue
            with contextlib.suppress(OSError), \
                    open(f"{root}{path.rstrip('/')}/pids.max", encoding="utf-8") as limits:
                limit = limits.read().strip()
                break
    kernel = []
    for name in ("pid_max", "threads-max"):
        with contextlib.suppress(OSError), \
                open(f"/proc/sys/kernel/{name}", encoding="ascii") as file:
            kernel.append(f"{name} {file.read().strip()}")
    return ", ".join([f"pids.max {limit}", *kernel])


def machine(pdsh: str | None) -> dict[str, object]:
    model = platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as file:
        model = next((line.split(":", 1)[1].strip() for line in file
                      if line.startswith("model name")), model)
    version = "unknown"
    with contextlib.suppress(Exception):
        from importlib.metadata import version as installed
        version = installed("ttyserve")
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)
    return {"cpu": model, "nproc": len(os.sched_getaffinity(0)), "kernel": platform.release(),
            "python": platform.python_version(), "ttyserve": version,
            "pdsh": pdsh_version(pdsh), "load": list(os.getloadavg()),
            "rlimit_nproc": "unlimited" if nproc[0] == resource.RLIM_INFINITY else nproc[0],
            "pids_max": pids_limit()}


def memory_check(parallel: int) -> str | None:
    """Why P far sides at once would not fit in this machine's memory, or None; every far
    side is a Python process on this machine."""
    need = parallel * FAR_SIDE_MIB
    available = 0
    with contextlib.suppress(OSError, ValueError, StopIteration), \
            open("/proc/meminfo", encoding="ascii") as file:
        available = next(int(line.split()[1]) for line in file
                         if line.startswith("MemAvailable:")) // MIB
    if available and need > available // 2:
        return (f"{parallel} far sides at once need ~{need:,} MiB, more than half of the "
                f"{available:,} MiB available: use a smaller --parallel or --targets")
    if parallel >= 100:
        say(f"{parallel} far sides at once will hold ~{need:,} MiB "
            f"(of {available:,} MiB available)")
    return None


def nofile_limit(parallel: int) -> tuple[int, str]:
    """Raise the soft RLIMIT_NOFILE to the hard limit when P targets might not fit in it
    (both clients inherit it); the limit in force and what was done."""
    need = parallel * FDS_PER_TARGET + FD_HEADROOM
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if need <= soft:
        return soft, f"RLIMIT_NOFILE {soft} (enough for {parallel} targets at once)"
    raised = raise_nofile_limit()
    note = (f"RLIMIT_NOFILE raised from {soft} to {raised} (the hard limit) for "
            f"{parallel} targets at once")
    if raised < need:
        note += f"; still under the ~{need} descriptors they may need: runs may fail"
    return raised, note


def alone(argv: list[str], times: int = 3) -> tuple[float, float]:
    """Median wall and CPU seconds of ``argv`` run on its own with stdin at end-of-file."""
    walls: list[float] = []
    cpus: list[float] = []
    for _ in range(times):
        began = time.monotonic()
        with open(os.devnull, "rb") as empty:
            child = subprocess.Popen(argv, stdin=empty, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        walls.append(time.monotonic() - began)
        cpus.append(usage.ru_utime + usage.ru_stime)
    return median(walls), median(cpus)


def local_output(command: list[str]) -> list[bytes]:
    """What the command prints on stdout here, line by line (the per-target expectation)."""
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    if done.returncode != 0:
        raise BenchmarkFailed(f"{shlex.join(command)} exits {done.returncode} here: "
                              f"{done.stderr.decode(errors='replace').strip()}")
    lines = done.stdout.splitlines()
    if not lines:
        raise BenchmarkFailed(f"{shlex.join(command)} prints nothing: choose a command whose "
                              "output shows that each target answered")
    return lines


@dataclass(frozen=True)
class Loopback:
    """A loopback sshd of this run: how to reach it, and the warm server beside it."""

    config: Path  # the ssh client configuration reaching it under any host name
    runtime: str | None  # the runtime directory of the warm server (this machine's), if warm


@contextlib.contextmanager
def loopback_sshd(directory: Path, warm: bool = False) -> Iterator[Loopback]:
    """A real sshd on 127.0.0.1 for the run. Its logins' `serve --stdio` reach a warm
    server started here first (``warm``, as on a host where an earlier connection started
    one), or none. Their HOME is ``directory``: the user's own shell start-up files (a
    pyenv's rehash racing 32 logins in ~/.pyenv) stay out of both tools' stderr."""
    from .peers import OpenSSHSystem

    with contextlib.ExitStack() as stack:
        runtime = stack.enter_context(warm_far_side(str(directory))) if warm else None
        sshd = OpenSSHSystem(str(directory),
                             {**far_side_environment(runtime), "HOME": str(directory)})
        if (reason := sshd.unavailable()) is not None:
            raise BenchmarkFailed(reason)
        sshd.start()
        stack.callback(sshd.stop)
        yield Loopback(sshd.client_config, runtime)


def run_once(tool: str, targets: int, parallel: int, workdir: str,
             command: str = "uname -n", over: str = "local", warm: bool = False) -> float:
    """One checked run of ``tool`` over ``targets`` hosts, for `make bench`: simulated
    (``over="local"``) or reached through a loopback sshd (``over="ssh"``, which is started
    before and stopped after the timed run, with a warm far side if ``warm``). Its wall time
    in seconds. Raises BenchmarkFailed, keeping nothing."""
    argv = shlex.split(command)
    directory = Path(tempfile.mkdtemp(prefix="fanout-", dir=workdir))
    try:
        ttyserve = ttyserve_script() or shutil.which("ttyserve")
        if ttyserve is None:
            raise BenchmarkFailed("no ttyserve next to this Python or on PATH")
        with contextlib.ExitStack() as stack:
            loopback = (stack.enter_context(loopback_sshd(directory, warm)) if over == "ssh"
                        else None)
            setup = Setup(directory, targets, parallel, argv, ttyserve, shutil.which("pdsh"),
                          local_output(argv), loopback)
            stdout, stderr = directory / "out", directory / "err"
            run = measure(setup.argv(tool), stdout, stderr, 60.0 + targets, setup.environment())
        check(setup, tool, run, stdout, stderr)
        return run.wall
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# --- the table ---------------------------------------------------------------------------

METRICS: list[tuple[str, str]] = [
    ("wall_s", "wall s"),
    ("targets_per_s", "targets/s"),
    ("client_cpu_s", "client CPU s (own)"),
    ("client_cpu_ms_per_target", "client CPU ms/target"),
    ("descendants_cpu_s", "descendants' CPU s"),
    ("descendants_cpu_ms_per_target", "descendants' CPU ms/target"),
    ("cores_busy", "cores busy (all CPU / wall)"),
    ("client_hwm_mib", "client peak RSS MiB"),
    ("child_hwm_mib", "largest child's peak RSS MiB"),
    ("children_rss_mib", "children's RSS at once, peak MiB"),
    ("client_fds", "client peak descriptors"),
    ("running", "peak running targets"),
    ("fds_per_running", "descriptors per running target"),
    ("client_threads", "client peak threads"),
]


def ratio(values: dict[str, Summary]) -> str:
    if "ttyserve" not in values or "pdsh" not in values:
        return "-"
    mine, theirs = values["ttyserve"].median, values["pdsh"].median
    if theirs == 0:
        return "-"
    return f"{number(mine / theirs)}x"


def table(results: dict[str, dict[str, list[float]]]) -> str:
    tools = [tool for tool in TOOLS if tool in results]
    rows: list[list[str]] = []
    for key, label in METRICS:
        values = {tool: Summary.of(runs) for tool in tools
                  if (runs := results[tool].get(key))}
        if values:
            rows.append([label, *[cell(values.get(tool)) for tool in tools], ratio(values)])
    return render_table(["metric", *tools, "ttyserve/pdsh"], rows)


# --- main --------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fanout", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", type=int, default=500, metavar="N",
                        help="simulated targets (default 500)")
    width = parser.add_mutually_exclusive_group()
    width.add_argument("--parallel", type=int, default=32, metavar="P",
                       help="targets at once, for both tools (default 32, ttyserve's default)")
    width.add_argument("--parallel-all", action="store_true",
                       help="P = N: every target at once (shows descriptors per target)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs of each tool, alternating (default 3)")
    parser.add_argument("--command", default="uname -n",
                        help="run on every target, split as a shell splits words; no shell "
                             "runs it, and pdsh's exec module splits it again on spaces, so "
                             "keep it free of quoting (default 'uname -n')")
    parser.add_argument("--over", choices=("local", "ssh"), default="local",
                        help="local: simulated far sides (default); ssh: every target is an "
                             "alias of a loopback sshd this run starts, for both tools "
                             "(ttyserve: `via:ssh -F CONFIG hostNNN`; pdsh: -R ssh with "
                             "PDSH_SSH_ARGS='-F CONFIG %%h')")
    parser.add_argument("--warm", action="store_true",
                        help="with --over ssh: a warm far side runs before the first target "
                             "(as on hosts an earlier connection started one)")
    parser.add_argument("--ttyserve", metavar="PATH",
                        help="the ttyserve to run, as the client and as the far side "
                             "(default: the one next to this Python)")
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help="fail a run that takes longer (default 60 + 1 s per target)")
    parser.add_argument("--json", type=Path, metavar="PATH",
                        help="also write every run's numbers there")
    args = parser.parse_args(argv)
    if args.targets < 1 or args.rounds < 1 or args.parallel < 1:
        parser.error("--targets, --parallel and --rounds must be at least 1")
    args.parallel = args.targets if args.parallel_all else min(args.parallel, args.targets)
    args.timeout = args.timeout or 60.0 + args.targets
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["TTYSERVE_WARM"] = "0"  # no warm server left behind (--warm starts its own)
    ttyserve = args.ttyserve or ttyserve_script() or "ttyserve (none beside this Python)"
    if not os.access(ttyserve, os.X_OK):
        say(f"no ttyserve at {ttyserve}: install the project (make bench) or pass --ttyserve")
        return 2
    pdsh = shutil.which("pdsh")
    command = shlex.split(args.command)
    if (refusal := memory_check(args.parallel)) is not None:
        say(refusal)
        return 2
    limit, limit_note = nofile_limit(args.parallel)
    say(limit_note)
    info = machine(pdsh)
    load = os.getloadavg()
    workdir = Path(tempfile.mkdtemp(prefix="ttyserve-fanout-"))
    keep = False
    results: dict[str, dict[str, list[float]]] = {}
    stack = contextlib.ExitStack()
    try:
        loopback = (stack.enter_context(loopback_sshd(workdir, args.warm))
                    if args.over == "ssh" else None)
        setup = Setup(workdir, args.targets, args.parallel, command, ttyserve, pdsh,
                      local_output(command), loopback)
        tools = [tool for tool in TOOLS if tool != "pdsh" or pdsh]
        if pdsh is None:
            say("pdsh is not installed (apt-get install pdsh): measuring ttyserve alone")
        far_wall, far_cpu = alone(["env", "SIM=host001", ttyserve, "serve", "--stdio"])
        cmd_wall, cmd_cpu = alone(["env", "SIM=host001", *command])
        say(f"{args.targets} targets, {args.parallel} at once, {args.rounds} rounds; "
            f"load average {load[0]:.2f}")
        for round_ in range(1, args.rounds + 1):
            for tool in tools:
                stdout = workdir / f"{tool}-{round_}.out"
                stderr = workdir / f"{tool}-{round_}.err"
                run = measure(setup.argv(tool), stdout, stderr, args.timeout,
                              setup.environment())
                check(setup, tool, run, stdout, stderr)
                values = run.metrics(args.targets)
                store = results.setdefault(tool, {})
                for key, value in values.items():
                    store.setdefault(key, []).append(value)
                say(f"  round {round_}/{args.rounds} {tool}: wall {run.wall:.2f} s, "
                    f"client CPU {run.client_cpu:.2f} s, descendants' CPU "
                    f"{run.descendants_cpu:.2f} s, client RSS {run.peaks.hwm_kib / MIB:.1f} "
                    f"MiB, {run.peaks.fds} descriptors, {run.peaks.children} running "
                    f"({run.peaks.samples} samples)")
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    except BenchmarkFailed as exc:
        say(f"FAILED: {exc}")
        keep = any(workdir.glob("*.out"))
        if keep:
            say(f"(the runs' files are kept in {workdir})")
        return 1
    finally:
        stack.close()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)

    print()
    print(f"Fan-out: {args.targets} simulated targets, {args.parallel} at once, "
          f"`{shlex.join(command)}` on each; medians (min-max) of {args.rounds} run(s) per "
          f"tool, alternating")
    print()
    print(table(results))
    print()
    print(f"one far side alone: `env SIM=host001 {ttyserve} serve --stdio` with stdin at EOF: "
          f"{far_wall * 1e3:.0f} ms wall, {far_cpu * 1e3:.0f} ms CPU (median of 3)")
    print(f"one command alone: `env SIM=host001 {shlex.join(command)}`: "
          f"{cmd_wall * 1e3:.1f} ms wall, {cmd_cpu * 1e3:.1f} ms CPU (median of 3)")
    print(f"machine: {info['nproc']} cores ({info['cpu']}), Linux {info['kernel']}, "
          f"Python {info['python']}, ttyserve {info['ttyserve']}, {info['pdsh']}")
    print(f"limits: {limit_note}; RLIMIT_NPROC {info['rlimit_nproc']}; "
          f"{info['pids_max']}; load average at start "
          f"{' '.join(f'{value:.2f}' for value in load)}")
    print("commands (HOSTS: a file of lines `via:env SIM=hostNNN`):")
    for tool in results:
        shown = setup.argv(tool)
        if tool == "ttyserve":
            shown[shown.index(str(setup.hosts_file))] = "HOSTS"
        print(f"  {tool}: {shlex.join(shown)}")
    if args.json:
        document = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "targets": args.targets,
                    "parallel": args.parallel, "rounds": args.rounds, "command": command,
                    "machine": info, "nofile": limit,
                    "alone": {"far_side_wall_s": far_wall, "far_side_cpu_s": far_cpu,
                              "command_wall_s": cmd_wall, "command_cpu_s": cmd_cpu},
                    "metrics": {tool: {key: Summary.of(runs).as_json()
                                       for key, runs in values.items()}
                                for tool, values in results.items()}}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=2) + "\n")
        print(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
