"""The SSH peers: asyncssh (server in its own process) and OpenSSH (when sshd exists).

Both listen on 127.0.0.1 only, with host and client keys generated into the
run's temp dir; every command runs under a PTY or pipes as the workload asks.
The benchmark process is the client: asyncssh's client library in-process,
OpenSSH's `ssh` as subprocesses.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import procs
from .systems import (
    ECHO_MARKER,
    WARMUP_ROUNDS,
    Probe,
    ScaleRun,
    SessionRun,
    System,
    Transfer,
    now,
    timed_subprocess,
)

if TYPE_CHECKING:
    from .fanout import Loopback

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT = 20.0
MOST_SESSIONS = 20  # OpenSSH's: ~0.3 s each, 200 took a minute a repetition for the same rate
PRIVSEP_DIR = Path("/run/sshd")  # sshd as root refuses to start without it
READ_SIZE = 256 * 1024


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def _stop(process: subprocess.Popen[bytes] | None) -> None:
    if process is None:
        return
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# --- asyncssh ------------------------------------------------------------------


class AsyncsshSystem(System):
    """asyncssh's server in a subprocess (benchmarks/asyncssh_server.py), its client here."""

    name = "asyncssh"
    transports = ("tcp",)

    def __init__(self, workdir: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="asyncssh-", dir=workdir))
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0
        self._keys_made = False

    def unavailable(self) -> str | None:
        try:
            import asyncssh  # noqa: F401
        except ImportError as exc:
            return f"asyncssh is not installed ({exc}); `make bench` installs it"
        return None

    def _make_keys(self) -> None:
        import asyncssh

        host = asyncssh.generate_private_key("ssh-ed25519")
        client = asyncssh.generate_private_key("ssh-ed25519")
        host.write_private_key(str(self.dir / "host_key"))
        client.write_private_key(str(self.dir / "client_key"))
        client.write_public_key(str(self.dir / "authorized_keys"))
        self._keys_made = True

    def start(self) -> None:
        if not self._keys_made:
            self._make_keys()
        out, err = self.dir / "stdout", self.dir / "stderr"
        with open(out, "wb") as out_file, open(err, "wb") as err_file:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.asyncssh_server",
                 "--host-key", str(self.dir / "host_key"),
                 "--authorized-keys", str(self.dir / "authorized_keys")],
                stdin=subprocess.DEVNULL, stdout=out_file, stderr=err_file, cwd=REPO)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for line in out.read_text().splitlines():
                if line.startswith("listening "):
                    self.port = int(line.split()[1])
                    return
            if self.process.poll() is not None:
                break
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"the asyncssh server did not start: {_tail(err)}")

    def stop(self) -> None:
        process, self.process = self.process, None
        _stop(process)

    def server_pids(self) -> list[int]:
        return [self.process.pid] if self.process is not None else []

    def _connect(self) -> Any:
        import asyncssh

        return asyncssh.connect(
            "127.0.0.1", self.port, username=getpass.getuser(),
            client_keys=[str(self.dir / "client_key")], known_hosts=None, agent_path=None,
            config=None, preferred_auth="publickey")

    async def _open_echo(self, conn: Any, argv: list[str]) -> Any:
        process = await conn.create_process(shlex.join(argv), term_type="xterm-256color",
                                            term_size=(80, 24), encoding=None)
        seen = b""
        while ECHO_MARKER not in seen:
            data = await process.stdout.read(4096)
            if not data:
                raise RuntimeError("the echo command exited")
            seen += data
        return process

    @staticmethod
    async def _echo_rounds(process: Any, rounds: int) -> list[float]:
        latencies: list[float] = []
        for index in range(WARMUP_ROUNDS + rounds):
            start = now()
            process.stdin.write(b"x")
            if await process.stdout.read(16) != b"x":
                raise RuntimeError("the echo came back wrong")
            if index >= WARMUP_ROUNDS:
                latencies.append(now() - start)
        return latencies

    def stream(self, argv: list[str], pty: bool, transport: str) -> Transfer:
        async def main() -> Transfer:
            start = now()
            nbytes = 0
            async with self._connect() as conn:
                process = await conn.create_process(
                    shlex.join(argv), term_type="xterm-256color" if pty else None,
                    encoding=None)
                while data := await process.stdout.read(READ_SIZE):
                    nbytes += len(data)
                result = await process.wait()
            seconds = now() - start
            if result.exit_status != 0:
                raise RuntimeError(f"{argv[0]}: exit {result.exit_status}")
            return Transfer(nbytes, seconds)

        return asyncio.run(main())

    def echo(self, argv: list[str], rounds: int, transport: str) -> list[float]:
        async def main() -> list[float]:
            async with self._connect() as conn:
                process = await self._open_echo(conn, argv)
                return await self._echo_rounds(process, rounds)

        return asyncio.run(main())

    def sessions(self, argv: list[str], count: int, transport: str) -> SessionRun:
        async def main() -> SessionRun:
            latencies: list[float] = []
            start = now()
            for _ in range(count):
                begin = now()
                async with self._connect() as conn:
                    result = await conn.run(shlex.join(argv), check=False, encoding=None)
                    latencies.append(now() - begin)
                if result.exit_status != 0:
                    raise RuntimeError(f"{argv[0]}: exit {result.exit_status}")
            return SessionRun(latencies, now() - start)

        return asyncio.run(main())

    def scale(self, argv: list[str], count: int, rounds: int, probe: Probe,
              transport: str) -> ScaleRun:
        async def main() -> ScaleRun:
            async with contextlib.AsyncExitStack() as stack:
                processes: list[Any] = []
                start = now()
                for _ in range(count):
                    conn = await stack.enter_async_context(self._connect())
                    processes.append(await self._open_echo(conn, argv))
                opened = now() - start
                usage = probe()
                latencies = await self._echo_rounds(processes[-1], rounds)
            return ScaleRun(opened, usage, latencies)

        return asyncio.run(main())

    def exec_command(self, argv: list[str], transport: str) -> list[str]:
        return [sys.executable, "-m", "benchmarks.asyncssh_client", "--port", str(self.port),
                "--key", str(self.dir / "client_key"), "--", *argv]


# --- OpenSSH -------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def find_sshd() -> str | None:
    return shutil.which("sshd") or next(
        (path for path in ("/usr/sbin/sshd", "/usr/local/sbin/sshd") if os.access(path, os.X_OK)),
        None)


class OpenSSHSystem(System):
    """OpenSSH's sshd on 127.0.0.1 with a generated config; `ssh` subprocesses as clients."""

    name = "openssh"
    transports = ("tcp",)

    def __init__(self, workdir: str, environment: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.environment = environment or {}  # set in every login's environment (SetEnv)
        self.dir: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.made_privsep = False

    def unavailable(self) -> str | None:
        if find_sshd() is None:
            return "sshd is not installed (the OpenSSH server; e.g. apt-get install openssh-server)"
        if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
            return "ssh or ssh-keygen is not installed"
        return None

    def _setup(self) -> Path:
        directory = Path(tempfile.mkdtemp(prefix="openssh-", dir=self.workdir))
        for name in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                            str(directory / name)], check=True, stdin=subprocess.DEVNULL)
        shutil.copy(directory / "client_key.pub", directory / "authorized_keys")
        self.port = _free_port()
        (directory / "sshd_config").write_text("\n".join([
            f"ListenAddress 127.0.0.1:{self.port}",
            f"HostKey {directory / 'host_key'}",
            f"AuthorizedKeysFile {directory / 'authorized_keys'}",
            f"PidFile {directory / 'sshd.pid'}",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
            "StrictModes no", "PermitRootLogin yes", "MaxStartups 2000", "MaxSessions 2000",
            "UseDNS no", "PrintMotd no", "PrintLastLog no", "LogLevel ERROR",
            *([f"SetEnv {' '.join(f'{k}={v}' for k, v in self.environment.items())}"]
              if self.environment else []), "",
        ]))
        # Every client (ssh, pdsh's ssh, ttyserve's carriers) takes its options from one file:
        # any host name reaches this sshd, so fan-out can name many targets.
        (directory / "ssh_config").write_text("\n".join([
            "Host *", "  HostName 127.0.0.1", f"  Port {self.port}",
            f"  User {getpass.getuser()}", f"  IdentityFile {directory / 'client_key'}",
            "  IdentitiesOnly yes", "  StrictHostKeyChecking no",
            "  UserKnownHostsFile /dev/null", "  BatchMode yes", "  LogLevel ERROR", "",
        ]))
        return directory

    @property
    def client_config(self) -> Path:
        """The ssh client configuration that reaches this sshd under any host name."""
        assert self.dir is not None
        return self.dir / "ssh_config"

    def start(self) -> None:
        self.dir = directory = self._setup()
        if os.geteuid() == 0 and not PRIVSEP_DIR.exists():
            PRIVSEP_DIR.mkdir(mode=0o755)
            self.made_privsep = True
        sshd = find_sshd()
        assert sshd is not None
        err = directory / "stderr"
        with open(err, "wb") as err_file:
            self.process = subprocess.Popen(
                [sshd, "-D", "-e", "-f", str(directory / "sshd_config")],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err_file)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.port), timeout=1) as sock:
                if sock.recv(4).startswith(b"SSH"):
                    return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        reason = _tail(err)
        self.stop()
        raise RuntimeError(f"sshd did not start: {reason}")

    def stop(self) -> None:
        process, self.process = self.process, None
        _stop(process)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        if self.made_privsep:
            self.made_privsep = False
            with contextlib.suppress(OSError):
                PRIVSEP_DIR.rmdir()

    def server_pids(self) -> list[int]:
        if self.process is None:
            return []
        pids = [self.process.pid]
        for pid in procs.descendants(self.process.pid):
            with contextlib.suppress(OSError):
                if procs.command_name(pid).startswith("sshd"):
                    pids.append(pid)
        return pids

    def _ssh(self, argv: list[str], pty: bool) -> list[str]:
        return ["ssh", "-F", str(self.client_config), "-tt" if pty else "-T", "loopback",
                shlex.join(argv)]

    def _popen(self, argv: list[str], pty: bool) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self._ssh(argv, pty), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def stream(self, argv: list[str], pty: bool, transport: str) -> Transfer:
        start = now()
        client = self._popen(argv, pty)
        assert client.stdout is not None
        nbytes = procs.read_to_eof(client.stdout.fileno())
        code = client.wait()
        seconds = now() - start
        if code != 0:
            raise RuntimeError(f"ssh exited {code}")
        return Transfer(nbytes, seconds)

    @staticmethod
    def _echo_rounds(client: subprocess.Popen[bytes], rounds: int) -> list[float]:
        assert client.stdin is not None and client.stdout is not None
        write_fd, read_fd = client.stdin.fileno(), client.stdout.fileno()
        latencies: list[float] = []
        for index in range(WARMUP_ROUNDS + rounds):
            start = now()
            os.write(write_fd, b"x")
            if os.read(read_fd, 16) != b"x":
                raise RuntimeError("the echo came back wrong")
            if index >= WARMUP_ROUNDS:
                latencies.append(now() - start)
        return latencies

    @staticmethod
    def _close(client: subprocess.Popen[bytes]) -> None:
        client.kill()
        client.communicate()

    def echo(self, argv: list[str], rounds: int, transport: str) -> list[float]:
        client = self._popen(argv, pty=True)
        try:
            assert client.stdout is not None
            procs.read_until(client.stdout.fileno(), ECHO_MARKER)
            return self._echo_rounds(client, rounds)
        finally:
            self._close(client)

    def sessions(self, argv: list[str], count: int, transport: str) -> SessionRun:
        latencies: list[float] = []
        start = now()
        for _ in range(min(count, MOST_SESSIONS)):
            begin = now()
            code = subprocess.run(self._ssh(argv, pty=False), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, check=False).returncode
            latencies.append(now() - begin)
            if code != 0:
                raise RuntimeError(f"ssh exited {code}")
        return SessionRun(latencies, now() - start)

    def scale(self, argv: list[str], count: int, rounds: int, probe: Probe,
              transport: str) -> ScaleRun:
        clients: list[subprocess.Popen[bytes]] = []
        try:
            start = now()
            for _ in range(count):
                client = self._popen(argv, pty=True)
                clients.append(client)
                assert client.stdout is not None
                procs.read_until(client.stdout.fileno(), ECHO_MARKER)
            opened = now() - start
            usage = probe()
            latencies = self._echo_rounds(clients[-1], rounds)
        finally:
            for client in clients:
                self._close(client)
        return ScaleRun(opened, usage, latencies)

    def exec_command(self, argv: list[str], transport: str) -> list[str]:
        return self._ssh(argv, pty=False)

    def one_target(self, argv: list[str], loopback: Loopback) -> float:
        return timed_subprocess(["ssh", "-F", str(loopback.config), "host001",
                                 shlex.join(argv)]).seconds

    def cpu_pids(self) -> list[int]:
        return []  # per-connection sshd processes are gone (and reaped) before we can read them
