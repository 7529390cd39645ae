"""The door's cost (protocol section 15): a session on a target through `serve --targets`
against the same session over the same carrier run by the client itself.

    python -m benchmarks.door [--sessions 200] [--bytes 268435456] [--reps 5]

One far side on this machine: `via:env` carrying `ttyserve serve --stdio --persist` into a
runtime directory of its own, whose server runs the sessions. "door": a client on the
door's Unix socket opens them with `target`; the door's carrier connection to the target is
up (a first session started it) before anything is timed. "carrier": the client runs that
carrier itself (`connect("via:env ...", persist=True)`), connected before anything is timed.
Measured on one multiplexed connection each: sequential `true` sessions from `open` to
`exit` (p50 ms), and `head -c BYTES /dev/zero` in pipe mode (MB/s). The two alternate, in
both orders, REPS times; medians and the door's ratio to the carrier are printed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio

from .stats import median, percentile
from .systems import SessionRun, System, Transfer, now

VENV_TTYSERVE = Path(sys.executable).with_name("ttyserve")
TARGET = "bench"


def _server_pid(path: Path) -> int | None:
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return None
        pid, _, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                        12))
        return int(pid)


class FarSide:
    """A far side on this machine: a wrapper that runs this venv's ttyserve in a runtime
    directory of its own; its background server stopped by `stop`."""

    def __init__(self, workdir: str) -> None:
        self.runtime = Path(tempfile.mkdtemp(prefix="tts-far-", dir="/tmp"))
        self.runtime.chmod(0o700)
        self.wrapper = self.runtime / "ttyserve-far"
        self.wrapper.write_text(
            f'#!/bin/sh\nXDG_RUNTIME_DIR={self.runtime} exec {VENV_TTYSERVE} "$@"\n')
        self.wrapper.chmod(0o755)
        self.workdir = workdir

    def stop(self) -> None:
        pid = _server_pid(self.runtime / "ttyserve.sock")
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
                time.sleep(0.05)
        shutil.rmtree(self.runtime, ignore_errors=True)


class _Target(System):
    """What both systems share: a far side, and one connection held open while timed."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.far: FarSide | None = None

    def start(self) -> None:
        self.far = FarSide(self.workdir)

    def stop(self) -> None:
        if self.far is not None:
            self.far.stop()
            self.far = None

    def _connection(self) -> contextlib.AbstractAsyncContextManager[Any]:
        raise NotImplementedError

    spawn_options: dict[str, Any] = {}  # noqa: RUF012  # (read only)

    @contextlib.asynccontextmanager
    async def _connected(self) -> AsyncIterator[Any]:
        """A multiplexed connection whose carrier is up (a first session ran on it)."""
        async with self._connection() as conn:
            warm = await conn.spawn(["true"], pty=False, **self.spawn_options)
            await warm.wait()
            yield conn

    def sessions_one_connection(self, argv: list[str], count: int, transport: str
                                ) -> SessionRun:
        async def main() -> SessionRun:
            latencies: list[float] = []
            async with self._connected() as conn:
                start = now()
                for _ in range(count):
                    begin = now()
                    session = await conn.spawn(argv, pty=False, **self.spawn_options)
                    status = await session.wait()
                    latencies.append(now() - begin)
                    if status.code != 0:
                        raise RuntimeError(f"{argv[0]}: exit {status}")
                return SessionRun(latencies, now() - start)

        result: SessionRun = anyio.run(main, backend="asyncio")
        return result

    def stream(self, argv: list[str], pty: bool, transport: str) -> Transfer:
        async def main() -> Transfer:
            async with self._connected() as conn:
                start = now()
                session = await conn.spawn(argv, pty=pty, **self.spawn_options)
                nbytes = 0
                async for chunk in session:
                    nbytes += len(chunk.data)
                status = await session.wait()
                seconds = now() - start
            if status.code != 0:
                raise RuntimeError(f"{argv[0]}: exit {status}")
            return Transfer(nbytes, seconds)

        result: Transfer = anyio.run(main, backend="asyncio")
        return result


class DoorSystem(_Target):
    """Sessions on the target through a door (`serve --targets`, one worker)."""

    name = "ttyserve-door"
    spawn_options: dict[str, Any] = {"target": TARGET}  # noqa: RUF012

    def start(self) -> None:
        super().start()
        assert self.far is not None
        directory = Path(self.workdir)
        targets = directory / "door-targets.toml"
        targets.write_text(f'[targets.{TARGET}]\nvia = "via:env"\n'
                           f'remote_command = "{self.far.wrapper}"\n')
        self.socket = directory / "door.sock"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ttyserve", "serve", f"--listen=unix:{self.socket}",
             "--workers=1", "--targets", str(targets)], stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL)
        assert self.process.stdout is not None
        if not self.process.stdout.readline().startswith(b"listening"):
            raise RuntimeError("the door did not start")

    def stop(self) -> None:
        process = getattr(self, "process", None)
        if process is not None:
            process.send_signal(signal.SIGTERM)
            process.wait(20)
            if process.stdout is not None:
                process.stdout.close()
            self.process = None
        super().stop()

    def server_pids(self) -> list[int]:
        process = getattr(self, "process", None)
        return [process.pid] if process is not None else []

    def _connection(self) -> contextlib.AbstractAsyncContextManager[Any]:
        from ttyserve.client import connect

        return connect(f"unix:{self.socket}", multiplex=True, window=1 << 20)


class CarrierSystem(_Target):
    """The same sessions over the same carrier, run by the client itself."""

    name = "ttyserve-carrier"

    def _connection(self) -> contextlib.AbstractAsyncContextManager[Any]:
        from ttyserve.client import connect

        assert self.far is not None
        return connect("via:env", remote_command=str(self.far.wrapper), persist=True,
                       multiplex=True, window=1 << 20)


@contextlib.contextmanager
def _started(system: System) -> Iterator[System]:
    system.start()
    try:
        yield system
    finally:
        system.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.door", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--bytes", type=int, default=256 << 20)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="tts-bench-door-")
    results: dict[str, dict[str, list[float]]] = {}
    try:
        with _started(DoorSystem(workdir)) as door, _started(CarrierSystem(workdir)) as direct:
            for rep in range(args.reps):
                for system in (door, direct) if rep % 2 == 0 else (direct, door):
                    run = system.sessions_one_connection(["true"], args.sessions, "unix")
                    moved = system.stream(["head", "-c", str(args.bytes), "/dev/zero"],
                                          False, "unix")
                    values = results.setdefault(system.name, {"start_ms": [], "mbps": []})
                    values["start_ms"].append(percentile(run.latencies, 50) * 1e3)
                    values["mbps"].append(moved.nbytes / moved.seconds / 1e6)
                    print(f"rep {rep + 1} {system.name}: start p50 "
                          f"{values['start_ms'][-1]:.2f} ms, {values['mbps'][-1]:.0f} MB/s",
                          file=sys.stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    door_values, direct_values = results["ttyserve-door"], results["ttyserve-carrier"]
    print(f"{'':18}{'start p50 ms':>14}{'MB/s':>10}")
    for name, values in results.items():
        print(f"{name:18}{median(values['start_ms']):>14.2f}{median(values['mbps']):>10.0f}")
    print(f"{'door / carrier':18}"
          f"{median(door_values['start_ms']) / median(direct_values['start_ms']):>13.2f}x"
          f"{median(door_values['mbps']) / median(direct_values['mbps']):>9.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
