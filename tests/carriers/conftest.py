"""A real sshd on 127.0.0.1, for the carrier tests: throwaway host and client keys, a client
config that trusts only that host key, and a wrapper named `ssh` first on PATH that uses it.

Without openssh-server the tests are skipped, loudly (see the root conftest's summary).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest
from helpers import stop_warm_servers

SSHD = "/usr/sbin/sshd"
SSH = "/usr/bin/ssh"
SSH_KEYGEN = "/usr/bin/ssh-keygen"
PRIVSEP_DIR = Path("/run/sshd")  # sshd (as root) refuses to start without it
PRIVSEP_MADE = PRIVSEP_DIR / ".made-by-ttyserve-tests"  # we made it: the last test removes it
START_TIMEOUT = 15.0  # seconds for sshd to say it listens
STOP_TIMEOUT = 10.0  # seconds for sshd to end after SIGTERM, before SIGKILL
INSTALL_HINT = "openssh-server is not installed (apt-get install openssh-server)"


@dataclass
class Sshd:
    """A running sshd and how to reach it through the `ssh` on ``env``'s PATH."""

    port: int
    address: str  # ssh://127.0.0.1:PORT
    env: dict[str, str]  # os.environ with bin_dir first on PATH
    bin_dir: Path  # holds the `ssh` wrapper
    remote_command: str  # this venv's ttyserve (sshd's PATH does not include the venv)
    directory: Path  # the fixture's temporary directory (keys, configs, log)
    log: list[str]  # sshd's stderr lines so far

    def log_text(self) -> str:
        return "\n".join(self.log[-100:])


def free_port() -> int:
    """A port nothing listens on (now) on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _keygen(path: Path) -> str:
    """A throwaway ed25519 key at ``path``; returns its public line."""
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "ttyserve-test",
                    "-f", str(path)], check=True, timeout=30, stdin=subprocess.DEVNULL)
    return path.with_suffix(".pub").read_text().strip()


@contextlib.contextmanager
def privsep_directory() -> Iterator[None]:
    """/run/sshd for as long as this test's sshd runs. The tests run in several processes,
    each module's sshd its own, and every new ssh connection needs the directory: it is
    made when missing, and removed (if a test made it) by the last sshd to leave. Each
    holds a shared lock on this directory meanwhile; the one that leaves removes it only
    if it can have the lock alone, and a newcomer waits for that removal to be over."""
    lock = os.open(os.path.dirname(os.path.abspath(__file__)), os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_SH)
        with contextlib.suppress(FileExistsError):
            PRIVSEP_DIR.mkdir(mode=0o755)
            PRIVSEP_MADE.touch()  # (only by the one that made it)
        try:
            yield
        finally:
            if _alone(lock) and PRIVSEP_MADE.exists():  # else another sshd still needs it
                PRIVSEP_MADE.unlink()
                with contextlib.suppress(OSError):
                    PRIVSEP_DIR.rmdir()
    finally:
        os.close(lock)


def _alone(lock: int) -> bool:
    """Whether the lock on ``lock`` can be had exclusively now (no one else holds it)."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it does not end in time; always reaped."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _drain(stream: IO[bytes], log: list[str], listening: threading.Event, wanted: str) -> None:
    """Read sshd's stderr to its end (so it never blocks), noting when it listens."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        log.append(line)
        if wanted in line:
            listening.set()
    listening.set()  # it ended: the waiter looks at the log and the exit status


@pytest.fixture(scope="module")
def sshd() -> Iterator[Sshd]:
    if not os.access(SSHD, os.X_OK):
        pytest.skip(INSTALL_HINT)
    for program in (SSH, SSH_KEYGEN):
        if not os.access(program, os.X_OK):
            pytest.skip(f"openssh-client is not installed (apt-get install openssh-client): "
                        f"no {program}")
    directory = Path(tempfile.mkdtemp(prefix="tts-sshd-", dir="/tmp"))
    process: subprocess.Popen[bytes] | None = None
    drainer: threading.Thread | None = None
    privsep = contextlib.ExitStack()
    try:
        privsep.enter_context(privsep_directory())
        host_public = _keygen(directory / "host_ed25519")
        client_public = _keygen(directory / "client_ed25519")
        (directory / "authorized_keys").write_text(client_public + "\n")
        port = free_port()
        runtime = directory / "rt"
        runtime.mkdir(mode=0o700)
        config = directory / "sshd_config"
        config.write_text("\n".join([
            "ListenAddress 127.0.0.1",
            f"Port {port}",
            f"HostKey {directory / 'host_ed25519'}",
            f"AuthorizedKeysFile {directory / 'authorized_keys'}",
            f"PidFile {directory / 'sshd.pid'}",
            "StrictModes no",
            "UsePAM no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "PermitRootLogin prohibit-password",
            "UseDNS no",
            "X11Forwarding no",
            "PrintMotd no",
            "LogLevel VERBOSE",
            # The far sides' warm server (cli/warm.py) lives here, and ends with the fixture.
            f"SetEnv XDG_RUNTIME_DIR={runtime}",
            "",
        ]))
        process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE)
        log: list[str] = []
        listening = threading.Event()
        drainer = threading.Thread(
            target=_drain, args=(process.stderr, log, listening,
                                 f"Server listening on 127.0.0.1 port {port}"),
            daemon=True)
        drainer.start()
        if not listening.wait(START_TIMEOUT) or process.poll() is not None:
            raise AssertionError(f"sshd did not start listening on 127.0.0.1:{port} "
                                 f"(status {process.poll()}); its log:\n" + "\n".join(log))

        known_hosts = directory / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{port} {host_public}\n")
        client_config = directory / "ssh_config"
        client_config.write_text("\n".join([
            "Host *",
            f"    IdentityFile {directory / 'client_ed25519'}",
            "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {known_hosts}",
            "    GlobalKnownHostsFile /dev/null",
            "    StrictHostKeyChecking yes",
            "    BatchMode yes",
            "    ControlMaster no",
            "    ControlPath none",
            "    LogLevel ERROR",
            "",
        ]))
        bin_dir = directory / "bin"
        bin_dir.mkdir()
        wrapper = bin_dir / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec {SSH} -F {client_config} "$@"\n')
        wrapper.chmod(0o755)
        env = dict(os.environ)
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', os.defpath)}"
        env.pop("SSH_AUTH_SOCK", None)  # only the throwaway key, whatever agent runs here
        env.pop("TTYSERVE_CONNECT", None)
        yield Sshd(port=port, address=f"ssh://127.0.0.1:{port}", env=env, bin_dir=bin_dir,
                   remote_command=str(Path(sys.executable).parent / "ttyserve"),
                   directory=directory, log=log)
    finally:
        stop_warm_servers(directory / "rt")
        if process is not None:
            _stop(process)
            if drainer is not None:
                drainer.join(5)
            if process.stderr is not None:
                process.stderr.close()
        shutil.rmtree(directory, ignore_errors=True)
        privsep.close()
