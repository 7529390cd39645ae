"""`ttyserve serve` as a subprocess: start, find its addresses, stop.

This is the one place that knows which flags the installed ttyserve needs:
it reads `serve --help` and `exec --help` and adds a token (`--token-file`),
`--insecure` and raised connection limits when they exist, so that the
workloads never have to care.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

START_TIMEOUT = 20.0
STOP_TIMEOUT = 20.0
LIMIT = 8192  # connections and sessions: the scale workload opens 1,000 at once


class ServerFailed(RuntimeError):
    """The server did not start (the message carries the tail of its stderr)."""


def ttyserve_script() -> str | None:
    """The `ttyserve` script installed beside our interpreter, if there is one."""
    script = Path(sys.executable).with_name("ttyserve")
    return str(script) if script.exists() else None


def ttyserve_command() -> list[str]:
    """How users start ttyserve: the installed script (no `python -m`, whose runpy costs a
    start-up a few ms), else `python -m ttyserve`."""
    script = ttyserve_script()
    return [script] if script else [sys.executable, "-m", "ttyserve"]


@functools.cache
def _flags(subcommand: str) -> frozenset[str]:
    """The long options `ttyserve SUBCOMMAND --help` lists."""
    result = subprocess.run([sys.executable, "-m", "ttyserve", subcommand, "--help"],
                            capture_output=True, text=True, timeout=60, check=False)
    return frozenset(re.findall(r"--[a-z][a-z0-9-]*", result.stdout))


def serve_flags() -> frozenset[str]:
    return _flags("serve")


def exec_flags() -> frozenset[str]:
    return _flags("exec")


def _environment() -> dict[str, str]:
    """Ours without TTYSERVE_ settings, which would change what the server does."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TTYSERVE_")}


def far_side_environment(warm: str | None) -> dict[str, str]:
    """What a far side (`serve --stdio`) runs with: reaching the warm server of the runtime
    directory ``warm``, or, with None, none (so that no benchmark leaves one behind)."""
    if warm is None:
        return {"TTYSERVE_WARM": "0"}
    return {"TTYSERVE_WARM": "1", "XDG_RUNTIME_DIR": warm}


def stdio_server(sock: socket.socket, workdir: str, warm: str | None = None
                 ) -> subprocess.Popen[bytes] | None:
    """`ttyserve serve --stdio` on ``sock`` (a socket pair's end, for both stdin and
    stdout), through the warm server of ``warm`` if given; None when the installed ttyserve
    has no `--stdio`."""
    if "--stdio" not in serve_flags():
        return None
    return subprocess.Popen([*ttyserve_command(), "serve", "--stdio"], stdin=sock.fileno(),
                            stdout=sock.fileno(), stderr=subprocess.DEVNULL,
                            env={**_environment(), **far_side_environment(warm)}, cwd=workdir)


def relay_server(sock: socket.socket, workdir: str, runtime: Path | None
                 ) -> subprocess.Popen[bytes] | None:
    """`ttyserve serve --stdio --persist` on ``sock``, with ``runtime`` as its runtime
    directory (whose default socket a server answers on); None for a ttyserve without
    `--persist`."""
    if "--persist" not in serve_flags() or runtime is None:
        return None
    return subprocess.Popen([*ttyserve_command(), "serve", "--stdio", "--persist"],
                            stdin=sock.fileno(), stdout=sock.fileno(),
                            stderr=subprocess.DEVNULL,
                            env={**_environment(), "XDG_RUNTIME_DIR": str(runtime)}, cwd=workdir)


@contextlib.contextmanager
def warm_far_side(workdir: str) -> Iterator[str]:
    """A warm far side (ttyserve/cli/warm.py) in a runtime directory of its own, as a host
    has once a first `serve --stdio` started one; yields the directory. Ended after."""
    runtime = tempfile.mkdtemp(prefix="rt-", dir=workdir)
    process = subprocess.Popen([sys.executable, "-m", "ttyserve.cli.warm"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL,
                               env={**_environment(), "XDG_RUNTIME_DIR": runtime})
    try:
        assert process.stdout is not None
        if not process.stdout.readline().startswith(b"listening "):
            raise RuntimeError("this ttyserve has no warm far side (ttyserve.cli.warm)")
        yield runtime
    finally:
        process.terminate()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
        shutil.rmtree(runtime, ignore_errors=True)


def _tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


class TtyserveServer:
    """One `ttyserve serve` on a Unix socket in a temp dir and on 127.0.0.1:0."""

    def __init__(self, workdir: str, extra: tuple[str, ...] = ()) -> None:
        self.workdir = workdir
        self.extra = extra  # more flags for `serve`
        self.process: subprocess.Popen[bytes] | None = None
        self.dir: Path | None = None
        self.addresses: dict[str, str] = {}
        self.token: str | None = None
        self.token_file: str | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None, "the server is not running"
        return self.process.pid

    def address(self, transport: str) -> str:
        return self.addresses[transport]

    def _arguments(self, directory: Path) -> list[str]:
        flags = serve_flags()
        args = [sys.executable, "-m", "ttyserve", "serve",
                "--listen", f"unix:{directory / 'ttyserve.sock'}",
                "--listen", "tcp:127.0.0.1:0", "--command", "cat"]
        if "--allow-origin" in flags:  # a ttyserve with web listeners: the WebSocket rows
            args += ["--listen", "ws:127.0.0.1:0"]
        if "--insecure" in flags:
            args.append("--insecure")
        if "--token-file" in flags:
            self.token = secrets.token_urlsafe(24)
            token_path = directory / "token"
            fd = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as file:
                file.write(self.token + "\n")
            self.token_file = str(token_path)
            args += ["--token-file", self.token_file]
        for flag in ("--max-connections", "--max-sessions", "--max-sessions-per-connection"):
            if flag in flags:
                args += [flag, str(LIMIT)]
        if "--shutdown-timeout" in flags:
            args += ["--shutdown-timeout", "5"]
        return args + list(self.extra)

    def start(self) -> None:
        """Start the server and wait for its `listening` lines."""
        directory = Path(tempfile.mkdtemp(prefix="srv-", dir=self.workdir))
        self.dir = directory
        env = _environment()
        out_path, err_path = directory / "stdout", directory / "stderr"
        arguments = self._arguments(directory)
        listeners = arguments.count("--listen")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            self.process = subprocess.Popen(arguments, stdin=subprocess.DEVNULL,
                                            stdout=out, stderr=err, cwd=directory, env=env)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            lines = out_path.read_text(errors="replace").splitlines()
            found = [line.split(" ", 1)[1] for line in lines if line.startswith("listening ")]
            if len(found) >= listeners:
                for address in found:
                    self.addresses[address.split(":", 1)[0]] = address
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.02)
        code, reason = self.process.poll(), _tail(err_path)
        self.stop()
        raise ServerFailed(f"ttyserve serve did not start (exit {code}): {reason}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not drain in time; remove its files."""
        process, self.process = self.process, None
        if process is not None:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.dir is not None:
            for entry in self.dir.iterdir():
                with contextlib.suppress(OSError):
                    entry.unlink()
            with contextlib.suppress(OSError):
                self.dir.rmdir()
            self.dir = None
        self.addresses = {}

    def stderr_tail(self) -> str:
        return _tail(self.dir / "stderr") if self.dir is not None else ""

    def exec_command(self, transport: str, argv: list[str], pty: bool = False) -> list[str]:
        """The `ttyserve exec` command line that runs ``argv`` on this server."""
        args = [*ttyserve_command(), "exec", "--connect", self.address(transport)]
        if self.token_file is not None and "--token-file" in exec_flags():
            args += ["--token-file", self.token_file]
        return [*args, "-t" if pty else "-T", "--", *argv]
