"""Run the benchmark suite: `python -m benchmarks.run [--quick] [--only NAME]...`.

Every workload runs each system in turn, alternating (the order rotates each
repetition), several times; the table shows medians with the min-max range,
the issue's target for each row and whether `ttyserve` meets it. Results go
to benchmarks/results/latest.json as well. A failing system or workload is
reported with its reason and the rest goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType

from . import procs
from .door import CarrierSystem, DoorSystem
from .peers import AsyncsshSystem, OpenSSHSystem
from .server import serve_flags
from .stats import Summary, cell, render_table
from .systems import (
    NotApplicable,
    PdshSystem,
    RawCgroupSystem,
    RawSystem,
    System,
    TtyserveHttpSystem,
    TtyserveLibSystem,
    TtyserveModesSystem,
    TtyserveNoCgroupSystem,
    TtyserveObservedSystem,
    TtyserveOneWorkerSystem,
    TtyserveResumeSystem,
    TtyserveStalledSystem,
    TtyserveSystem,
    TtyserveUnobservedSystem,
    TtyserveWsSystem,
)
from .workloads import ALL_SYSTEMS, BY_NAME, FULL, QUICK, WORKLOADS, Context, Workload

RESULTS = Path(__file__).resolve().parent / "results" / "latest.json"
QUICK_RESULTS = RESULTS.with_name("latest-quick.json")
PARTIAL_RESULTS = RESULTS.with_name("latest-partial.json")  # --only, --systems, interrupted


class Timeout(Exception):
    """One measurement took longer than its deadline."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise Timeout in this (main) thread after ``seconds``; also interrupts blocking reads."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise Timeout(f"no result after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def say(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


@dataclass
class WorkloadResult:
    """Every run's values per system and metric, and why systems dropped out."""

    values: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self, system: str, metric: str) -> Summary | None:
        runs = self.values.get(system, {}).get(metric)
        return Summary.of(runs) if runs else None


def make_systems(names: list[str], workdir: str) -> list[System]:
    factories: dict[str, Callable[[str], System]] = {
        "raw": RawSystem, "ttyserve": TtyserveSystem, "ttyserve-lib": TtyserveLibSystem,
        "ttyserve-ws": TtyserveWsSystem, "ttyserve-http": TtyserveHttpSystem,
        "ttyserve-resume": TtyserveResumeSystem,
        "asyncssh": AsyncsshSystem, "openssh": OpenSSHSystem,
        "pdsh": PdshSystem, "raw-cgroup": RawCgroupSystem,
        "ttyserve-nocg": TtyserveNoCgroupSystem,
        "ttyserve-w1": TtyserveOneWorkerSystem,
        "ttyserve-observed": TtyserveObservedSystem,
        "ttyserve-unobserved": TtyserveUnobservedSystem,
        "ttyserve-stalled": TtyserveStalledSystem,
        "ttyserve-door": DoorSystem, "ttyserve-carrier": CarrierSystem,
        "ttyserve-modes": TtyserveModesSystem,
    }
    return [factories[name](workdir) for name in names]


def _failure(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text[:400]


def _restart(system: System) -> None:
    system.stop()
    system.start()


def run_workload(workload: Workload, systems: list[System], ctx: Context, reps: int,
                 limit: float, stop_at: float) -> WorkloadResult:
    """Alternate the systems ``reps`` times; stop every server whatever happens.

    Past ``stop_at`` (monotonic) no further repetition starts: the time budget is spent.
    """
    result = WorkloadResult()
    began = time.monotonic()
    active = [system for system in systems if system.name in workload.systems]
    started: list[System] = []
    try:
        workload.prepare(ctx)
        for system in active:
            try:
                with deadline(60):
                    system.start()
                started.append(system)
            except Exception as exc:
                result.errors[system.name] = f"did not start: {_failure(exc)}"
                say(f"  {system.name}: {result.errors[system.name]}")
                system.stop()
        for rep in range(reps):
            if rep and time.monotonic() > stop_at:
                say(f"  time budget spent: {workload.name} stops after {rep} repetition(s)")
                break
            shift = rep % len(started) if started else 0
            for system in started[shift:] + started[:shift]:
                if system.name in result.errors:
                    continue
                try:
                    with deadline(limit):
                        if workload.fresh_server_per_rep and rep > 0:
                            _restart(system)
                        values = workload.measure(system, ctx)
                except NotApplicable:
                    continue
                except Exception as exc:
                    result.errors[system.name] = _failure(exc)
                    say(f"  {workload.name} {system.name}: FAILED: {result.errors[system.name]}")
                    if os.environ.get("BENCH_DEBUG"):
                        traceback.print_exc()
                    continue
                store = result.values.setdefault(system.name, {})
                for key, value in values.items():
                    store.setdefault(key, []).append(value)
                shown = ", ".join(f"{key}={value:.4g}" for key, value in values.items())
                say(f"  {workload.name} rep {rep + 1}/{reps} {system.name}: {shown}")
    finally:
        for system in active:
            try:
                system.stop()
            except Exception as exc:
                say(f"  {system.name}: stop failed: {_failure(exc)}")
        if leftovers := _end_leftovers():
            say(f"  {workload.name}: ended {leftovers} process(es) a measure left behind")
    result.seconds = time.monotonic() - began
    return result


def _end_leftovers() -> int:
    """Kill and reap every process still below us once a workload's systems are stopped:
    a deadline that fires inside Popen, after the fork, leaves the child in no variable."""
    pids = procs.descendants(os.getpid())
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return len(pids)


def table(results: dict[str, WorkloadResult], names: list[str]) -> str:
    """One row per metric: a median (min-max) per system, the target, whether it is met."""
    used = [name for name in names
            if any(name in result.values for result in results.values())]
    rows: list[list[str]] = []
    for workload_name, result in results.items():
        workload = BY_NAME[workload_name]
        for metric in workload.metrics:
            column = {name: s for name in used if (s := result.summary(name, metric.key))}
            if not column:
                continue
            targets = [t for t in workload.targets if t.metric == metric.key]
            rows.append([
                workload_name, metric.label, *[cell(column.get(name)) for name in used],
                "; ".join(t.describe() for t in targets) or "-",
                "; ".join(t.check(column)[1] for t in targets) or "-",
            ])
    return render_table(["workload", "metric", *used, "target", "met"], rows)


def as_json(results: dict[str, WorkloadResult], meta: dict[str, object]) -> dict[str, object]:
    workloads: dict[str, object] = {}
    for name, result in results.items():
        workload = BY_NAME[name]
        metrics = {
            metric.key: {system: s.as_json() for system in result.values
                         if (s := result.summary(system, metric.key))}
            for metric in workload.metrics}
        column_of = {m.key: {sys_: s for sys_ in result.values
                             if (s := result.summary(sys_, m.key))} for m in workload.metrics}
        targets = []
        for target in workload.targets:
            met, shown = target.check(column_of[target.metric])
            targets.append({"metric": target.metric, "target": target.describe(),
                            "met": met, "value": shown})
        workloads[name] = {"title": workload.title, "metrics": metrics, "targets": targets,
                           "errors": result.errors, "seconds": round(result.seconds, 2)}
    return {"meta": meta, "workloads": workloads}


REGRESSION = 0.15  # a median this much worse than the previous run's is flagged


def _member(value: object, *keys: str) -> object:
    """value[keys[0]][keys[1]]..., or None where a level is missing or not a mapping."""
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def compare(previous: object, results: dict[str, WorkloadResult]) -> list[str]:
    """Each median against the previous run's (same workload, metric and system): the
    lines to print, a regression beyond REGRESSION marked so it is seen at a glance."""
    lines: list[str] = []
    for name, result in results.items():
        for metric in BY_NAME[name].metrics:
            for system, runs in result.values.items():
                old = _member(previous, "workloads", name, "metrics", metric.key, system,
                              "median")
                if metric.key not in runs or not isinstance(old, int | float) or not old:
                    continue
                new = Summary.of(runs[metric.key]).median
                change = new / old - 1
                worse = -change if metric.higher_is_better else change
                mark = ("REGRESSION" if worse > REGRESSION else
                        "better" if worse < -REGRESSION else "")
                lines.append(f"{name:13} {metric.label:30} {system:13} {old:>10.4g} -> "
                             f"{new:<10.4g} {change:+7.1%}  {mark}".rstrip())
    return lines


def machine() -> dict[str, object]:
    model = platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as file:
        model = next((line.split(":", 1)[1].strip() for line in file
                      if line.startswith("model name")), model)
    versions: dict[str, str] = {}
    for package in ("ttyserve", "anyio", "asyncssh"):
        with contextlib.suppress(Exception):
            from importlib.metadata import version
            versions[package] = version(package)
    return {"cpu": model, "cores": os.cpu_count(), "kernel": platform.release(),
            "python": platform.python_version(), "versions": versions}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes and 1 repetition: a smoke test")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help=f"run only this workload (repeatable): {', '.join(BY_NAME)}")
    parser.add_argument("--systems", default=",".join(ALL_SYSTEMS),
                        help="comma-separated systems to compare (default: all)")
    parser.add_argument("--reps", type=int,
                        help="repetitions of every workload (default: 5, or 3 for scale, "
                             "scale_pipes, client_cost and fanout; 2 with --quick)")
    parser.add_argument("--budget", type=float, default=480.0, metavar="SECONDS",
                        help="start no new repetition after this long (default 480), so that "
                             "a full run ends within 10 minutes even on a busy machine")
    parser.add_argument("--transport", choices=("tcp", "unix"), default="tcp",
                        help="how ttyserve is reached outside session_rate (default tcp, "
                             "like the SSH peers)")
    parser.add_argument("--json", type=Path,
                        help=f"default {RESULTS} ({QUICK_RESULTS.name} with --quick)")
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    args = parser.parse_args(argv)
    only = [name for item in args.only for name in item.split(",") if name]
    unknown = [name for name in only if name not in BY_NAME]
    systems = [name for name in args.systems.split(",") if name]
    bad = [name for name in systems if name not in ALL_SYSTEMS]
    if unknown or bad:
        parser.error(f"unknown workload or system: {', '.join(unknown + bad)}")
    args.only, args.system_names = only, systems
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for workload in WORKLOADS:
            print(f"{workload.name:14} {workload.title}")
        return 0
    sizes = QUICK if args.quick else FULL
    limit = 60.0 if args.quick else 90.0  # seconds for one measurement: ~10 s is typical
    nofile = procs.raise_nofile_limit()
    selected = [BY_NAME[name] for name in args.only] if args.only else WORKLOADS
    signal.signal(signal.SIGTERM, _interrupt)  # stop the servers and print, as Ctrl-C does
    # No workload leaves a warm server (ttyserve/cli/warm.py) behind in the user's runtime
    # directory: those that measure warm starts start one in a directory of their own.
    os.environ["TTYSERVE_WARM"] = "0"
    workdir = tempfile.mkdtemp(prefix="ttyserve-bench-")
    results: dict[str, WorkloadResult] = {}
    skipped: dict[str, str] = {}
    failed: dict[str, str] = {}
    began = time.monotonic()
    interrupted = False
    try:
        systems: list[System] = []
        for system in make_systems(args.system_names, workdir):
            reason = system.unavailable()
            if reason:
                skipped[system.name] = reason
                say(f"skipping {system.name}: {reason}")
            else:
                systems.append(system)
        ctx = Context(workdir, sizes, args.transport)
        say(f"ttyserve serve flags in use: token={'--token-file' in serve_flags()}, "
            f"insecure={'--insecure' in serve_flags()}; RLIMIT_NOFILE={nofile}; "
            f"sizes={'quick' if args.quick else 'full'}")
        for number, workload in enumerate(selected, 1):
            reps = args.reps or (2 if args.quick else workload.reps)
            say(f"[{number}/{len(selected)}, {time.monotonic() - began:.0f} s] "
                f"{workload.name}: {workload.title} ({reps} repetitions)")
            try:
                results[workload.name] = run_workload(workload, systems, ctx, reps, limit,
                                                      began + args.budget)
            except Exception as exc:
                failed[workload.name] = _failure(exc)
                say(f"  {workload.name}: FAILED: {failed[workload.name]}")
    except KeyboardInterrupt:
        interrupted = True
        say("interrupted: printing what was measured")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.monotonic() - began
    print()
    print(table(results, args.system_names))
    for name, result in results.items():
        for system_name, reason in result.errors.items():
            print(f"! {name} {system_name}: {reason}")
    for name, reason in failed.items():
        print(f"! {name}: {reason}")
    for system_name, reason in skipped.items():
        print(f"! skipped {system_name}: {reason}")
    print(f"({elapsed:.0f} s; medians (min-max) of the repetitions; "
          f"ttyserve via {args.transport} outside session_rate)")
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "quick": args.quick,
            "sizes": asdict(sizes), "transport": args.transport, "seconds": round(elapsed, 1),
            "skipped": skipped, "failed": failed, "machine": machine()}
    # Compared with the last whole run of the same kind; only a whole run replaces it.
    baseline = args.json or (QUICK_RESULTS if args.quick else RESULTS)
    partial = (interrupted or bool(args.only) or set(args.system_names) != set(ALL_SYSTEMS))
    written = args.json or (PARTIAL_RESULTS if partial else baseline)
    previous: object = None
    with contextlib.suppress(OSError, ValueError):
        previous = json.loads(baseline.read_text())
    written.parent.mkdir(parents=True, exist_ok=True)
    written.write_text(json.dumps(as_json(results, meta), indent=2) + "\n")
    before = previous.get("meta") if isinstance(previous, dict) else None
    if isinstance(before, dict):  # else no previous run (or not one of ours)
        if any(before.get(key) != meta[key] for key in ("sizes", "transport")):
            print(f"\nnot compared with the previous run in {baseline}: its sizes or "
                  "transport differ")
        elif changes := compare(previous, results):
            print(f"\nagainst the previous run ({baseline}, {before.get('date', '?')}); "
                  "medians:")
            print("\n".join(changes))
    print(f"results: {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
