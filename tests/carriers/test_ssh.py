"""Carriers for real: `ttyserve exec --connect ssh://...` and `--via 'ssh ...'` through the
system's ssh to a real sshd on 127.0.0.1 (the `sshd` fixture), whose far side runs this
venv's `ttyserve serve --stdio` (contracts.md, "One ttyserve, many hosts: carriers")."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import children_of, ttyserve_command

from ttyserve.exitcodes import ExecExit

if TYPE_CHECKING:  # not imported when run: `conftest` names a different module per directory
    from conftest import Sshd

pytestmark = pytest.mark.timeout(90)

RUN_TIMEOUT = 60.0  # seconds for one `ttyserve exec` to finish
REAP_TIMEOUT = 15.0  # seconds for a process to end once its client is gone


def run_exec(sshd: Sshd, *args: str, stdin: bytes = b"", env: dict[str, str] | None = None,
             ) -> subprocess.CompletedProcess[bytes]:
    """`ttyserve exec ARGS` as a subprocess, with the fixture's `ssh` first on PATH."""
    return subprocess.run(ttyserve_command("exec", *args), input=stdin, capture_output=True,
                          env=env or sshd.env, timeout=RUN_TIMEOUT)


def on_ssh(sshd: Sshd, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """`ttyserve exec --connect ssh://127.0.0.1:PORT --remote-command VENV/ttyserve ARGS`."""
    return run_exec(sshd, "--connect", sshd.address, "--remote-command", sshd.remote_command,
                    *args, stdin=stdin)


def explain(result: subprocess.CompletedProcess[bytes], sshd: Sshd) -> str:
    """What to show when an expectation fails: the client's streams and sshd's log."""
    return (f"exit {result.returncode}\nstdout: {result.stdout[-2000:]!r}\n"
            f"stderr: {result.stderr[-4000:]!r}\nsshd:\n{sshd.log_text()}")


def stderr_lines(result: subprocess.CompletedProcess[bytes]) -> list[str]:
    return result.stderr.decode(errors="replace").splitlines()


def closed_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago: ssh gets `Connection refused`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_gone(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` has ended (a zombie counts) within ``timeout`` seconds: a
    pidfd becomes readable when its process ends, whoever's child it is."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([pidfd], [], [], timeout)
        return bool(ready)
    finally:
        os.close(pidfd)


def reap_if_ours(pid: int) -> None:
    """An orphan adopted by this process (the test session is a subreaper) is reaped here."""
    with contextlib.suppress(ChildProcessError, ProcessLookupError):
        os.waitpid(pid, os.WNOHANG)


def command_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


# --- exit codes --------------------------------------------------------------------------


def test_the_remote_exit_code_comes_through_ssh(sshd: Sshd) -> None:
    result = on_ssh(sshd, "-T", "--", "sh", "-c", "exit 7")
    assert result.returncode == 7, explain(result, sshd)
    assert result.stdout == b"" and result.stderr == b"", explain(result, sshd)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["KILL", "TERM"])
def test_a_remote_death_by_signal_is_128_plus_its_number(sshd: Sshd,
                                                        sig: signal.Signals) -> None:
    result = on_ssh(sshd, "-T", "--", "sh", "-c", f"kill -{sig.name.removeprefix('SIG')} $$")
    assert result.returncode == ExecExit.SIGNAL_BASE + sig, explain(result, sshd)


# --- streams -------------------------------------------------------------------------------


COPY_AND_REVERSE = (
    "import sys\n"
    "data = sys.stdin.buffer.read()\n"
    "sys.stdout.buffer.write(data)\n"
    "sys.stderr.buffer.write(data[::-1])\n"
)


def test_stdout_and_stderr_stay_apart_byte_for_byte_over_2_mib(sshd: Sshd) -> None:
    payload = os.urandom(2 * 1024 * 1024 + 12345)
    result = on_ssh(sshd, "-T", "--", sys.executable, "-c", COPY_AND_REVERSE, stdin=payload)
    assert result.returncode == 0, explain(result, sshd)
    assert len(result.stdout) == len(payload), explain(result, sshd)
    assert result.stdout == payload
    assert len(result.stderr) == len(payload), explain(result, sshd)
    assert result.stderr == payload[::-1]


IS_A_TERMINAL = "test -t 0 && test -t 1 && tty"


def test_dash_t_gives_the_remote_command_a_pty(sshd: Sshd) -> None:
    result = on_ssh(sshd, "-t", "--", "sh", "-c", IS_A_TERMINAL)
    assert result.returncode == 0, explain(result, sshd)
    assert re.fullmatch(rb"/dev/pts/\d+\r?\n", result.stdout), explain(result, sshd)


def test_dash_capital_t_gives_it_pipes(sshd: Sshd) -> None:
    result = on_ssh(sshd, "-T", "--", "sh", "-c", IS_A_TERMINAL)
    assert result.returncode == 1, explain(result, sshd)  # `test -t 0` failed
    assert result.stdout == b"", explain(result, sshd)


# --- the client killed ------------------------------------------------------------------


def test_killing_the_client_ends_the_remote_command_and_the_carrier(sshd: Sshd) -> None:
    client = subprocess.Popen(
        ttyserve_command("exec", "--connect", sshd.address, "--remote-command",
                         sshd.remote_command, "-T", "--", "sh", "-c", "echo $$; exec sleep 600"),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=sshd.env)
    remote_pid = carrier_pid = None
    try:
        assert client.stdout is not None
        ready, _, _ = select.select([client.stdout], [], [], RUN_TIMEOUT)
        assert ready, f"the remote command printed nothing; sshd:\n{sshd.log_text()}"
        line = client.stdout.readline()
        assert re.fullmatch(rb"\d+\n", line), line
        remote_pid = int(line)
        carriers = [pid for pid in children_of(client.pid) if command_name(pid) == "ssh"]
        assert len(carriers) == 1, (carriers, children_of(client.pid))
        carrier_pid = carriers[0]
        assert not wait_gone(remote_pid, 0), "the remote command is not running"

        client.send_signal(signal.SIGKILL)
        assert client.wait(REAP_TIMEOUT) == -signal.SIGKILL

        assert wait_gone(remote_pid, REAP_TIMEOUT), (
            f"remote pid {remote_pid} outlived its client; sshd:\n{sshd.log_text()}")
        assert wait_gone(carrier_pid, REAP_TIMEOUT), f"the carrier {carrier_pid} outlived it"
    finally:
        if client.poll() is None:
            client.kill()
        client.communicate()
        for pid in (remote_pid, carrier_pid):  # only after a failure is either still there
            if pid is not None and not wait_gone(pid, 0):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                wait_gone(pid, REAP_TIMEOUT)
        if carrier_pid is not None:
            reap_if_ours(carrier_pid)  # the client's orphan is now this process's child


# --- --via -------------------------------------------------------------------------------


def test_via_ssh_gives_the_exit_code_and_the_bytes(sshd: Sshd) -> None:
    payload = os.urandom(300_000)
    result = run_exec(sshd, "--via", f"ssh -p {sshd.port} 127.0.0.1", "--remote-command",
                      sshd.remote_command, "-T", "--", "sh", "-c", "cat; exit 5",
                      stdin=payload)
    assert result.returncode == 5, explain(result, sshd)
    assert result.stdout == payload, explain(result, sshd)
    assert result.stderr == b"", explain(result, sshd)


# --- carrier failures ------------------------------------------------------------------


def test_a_closed_port_is_unreachable(sshd: Sshd) -> None:
    target = f"ssh://127.0.0.1:{(port := closed_port())}"
    result = run_exec(sshd, "--connect", target, "--remote-command", sshd.remote_command,
                      "--", "true")
    assert result.returncode == ExecExit.FAILURE, explain(result, sshd)
    lines = stderr_lines(result)
    assert f"{target}: ssh: connect to host 127.0.0.1 port {port}: Connection refused" in lines, (
        explain(result, sshd))
    told = [line for line in lines if line.startswith("ttyserve: ")]
    assert len(told) == 1 and told[0].startswith(f"ttyserve: {target}: unreachable: "), (
        explain(result, sshd))
    assert result.stdout == b""


def test_a_closed_port_is_a_retriable_json_error(sshd: Sshd) -> None:
    target = f"ssh://127.0.0.1:{closed_port()}"
    result = run_exec(sshd, "--connect", target, "--remote-command", sshd.remote_command,
                      "--json", "--", "true")
    assert result.returncode == ExecExit.FAILURE, explain(result, sshd)
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(events) == 1, explain(result, sshd)
    assert events[0]["event"] == "error"
    assert events[0]["class"] == "unreachable"
    assert events[0]["retriable"] is True
    assert events[0]["status"] == 255


def test_retries_run_ssh_again(sshd: Sshd, short_dir: Path) -> None:
    counter = short_dir / "tries"
    counting = short_dir / "bin"
    counting.mkdir()
    wrapper = counting / "ssh"
    wrapper.write_text(f'#!/bin/sh\necho try >> {counter}\nexec {sshd.bin_dir / "ssh"} "$@"\n')
    wrapper.chmod(0o755)
    env = {**sshd.env, "PATH": f"{counting}{os.pathsep}{sshd.env['PATH']}"}
    target = f"ssh://127.0.0.1:{closed_port()}"
    result = run_exec(sshd, "--connect", target, "--remote-command", sshd.remote_command,
                      "--retries", "2", "--", "true", env=env)
    assert result.returncode == ExecExit.FAILURE, explain(result, sshd)
    lines = stderr_lines(result)
    retrying = [line for line in lines if "retrying" in line]
    assert len(retrying) == 2, explain(result, sshd)
    assert all(line.startswith(f"ttyserve: {target}: unreachable: ") for line in retrying)
    assert counter.read_text().splitlines() == ["try"] * 3
    refused = [line for line in lines if line.startswith(f"{target}: ssh: connect to host")]
    assert len(refused) == 3, explain(result, sshd)


def test_no_ttyserve_on_the_far_side_is_not_installed(sshd: Sshd) -> None:
    result = run_exec(sshd, "--connect", sshd.address, "--", "true")  # no --remote-command
    assert result.returncode == ExecExit.FAILURE, explain(result, sshd)
    lines = stderr_lines(result)
    shell_said = [line for line in lines if line.startswith(f"{sshd.address}: ")]
    assert any("ttyserve" in line and "not found" in line for line in shell_said), (
        explain(result, sshd))
    told = [line for line in lines if line.startswith("ttyserve: ")]
    assert len(told) == 1 and told[0].startswith(f"ttyserve: {sshd.address}: not_installed: "), (
        explain(result, sshd))
    assert "--remote-command" in told[0]


# --- fan-out -----------------------------------------------------------------------------


def test_fan_out_through_ssh_prefixes_lines_and_sums_up(sshd: Sshd) -> None:
    first, second = sshd.address, f"ssh://root@127.0.0.1:{sshd.port}"
    result = run_exec(sshd, "--connect", first, "--connect", second, "--remote-command",
                      sshd.remote_command, "--", "echo", "hi")
    assert result.returncode == 0, explain(result, sshd)
    assert sorted(result.stdout.decode().splitlines()) == sorted([f"{first}: hi",
                                                                  f"{second}: hi"])
    summaries = [line for line in stderr_lines(result) if line.startswith("ttyserve: ")]
    assert summaries == [f"ttyserve: {first}: exit 0", f"ttyserve: {second}: exit 0"], (
        explain(result, sshd))
