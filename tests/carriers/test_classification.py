"""Every row of the carrier table (contracts.md, carriers), produced for real: a carrier
that ends before `welcome` is classified by remedy, `exec` exits 255 with one line, the
carrier's stderr is shown, and `--retries` tries again only the retriable classes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import start_server, ttyserve_command

from ttyserve.errors import CARRIER_FAILURES, CarrierFailure
from ttyserve.exitcodes import ExecExit

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]
REMOTE = str(Path(sys.executable).parent / "ttyserve")
RETRIES = 2


def carrier_script(directory: Path, name: str, ending: str) -> tuple[Path, Path]:
    """A carrier that counts its tries, says something on stderr, then ends as told."""
    counter = directory / f"{name}.tries"
    script = directory / name
    script.write_text(f"#!/bin/sh\necho try >> '{counter}'\n"
                      f"echo 'carrier {name} speaking' >&2\n{ending}\n")
    script.chmod(0o755)
    return script, counter


def run_exec(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(ttyserve_command("exec", "--json", *args, "--", "true"),
                          capture_output=True, text=True, timeout=40,
                          env={**os.environ, **(env or {})})


def check_report(result: subprocess.CompletedProcess[str], target: str,
                 failure: CarrierFailure, explanation: str | None = None) -> None:
    retriable = CARRIER_FAILURES[failure][0]
    assert result.returncode == ExecExit.FAILURE, result.stderr
    lines = [line for line in result.stderr.splitlines()
             if line.startswith(f"ttyserve: {target}: {failure}: ")]
    assert lines, result.stderr
    assert (explanation or CARRIER_FAILURES[failure][1]) in lines[-1]
    errors = [event for event in map(json.loads, result.stdout.splitlines())
              if event["event"] == "error"]
    assert len(errors) == 1, result.stdout
    assert errors[0]["class"] == failure
    assert errors[0]["retriable"] is retriable


ROWS = [
    ("exit 127", "not-found", CarrierFailure.NOT_INSTALLED),
    ("exit 255", "ssh", CarrierFailure.UNREACHABLE),  # a carrier program named ssh
    ("exit 2", "usage", CarrierFailure.USAGE),
    ("exit 3", "config", CarrierFailure.CONFIG),
    ("exit 4", "lease", CarrierFailure.LEASE),
    ("exit 5", "unsupported", CarrierFailure.UNSUPPORTED),
    ("exit 1", "other", CarrierFailure.CRASHED),
    ("exit 255", "not-ssh", CarrierFailure.CRASHED),  # 255 means unreachable only from ssh
    ("exit 0", "quiet", CarrierFailure.CRASHED),  # ended "well" but never said welcome
    ("kill -TERM $$", "signalled", CarrierFailure.CRASHED),
]


@pytest.mark.parametrize(("ending", "name", "failure"), ROWS,
                         ids=[f"{name}-{failure}" for _, name, failure in ROWS])
def test_each_row_is_classified_shown_and_retried_only_if_retriable(
        tmp_path: Path, ending: str, name: str, failure: CarrierFailure) -> None:
    script, counter = carrier_script(tmp_path, name, ending)
    target = f"via:{script}"
    result = run_exec("--retries", str(RETRIES), "--connect", target)
    check_report(result, target, failure)
    assert f"{target}: carrier {name} speaking" in result.stderr.splitlines()
    tries = counter.read_text().count("try")
    assert tries == (RETRIES + 1 if CARRIER_FAILURES[failure][0] else 1)
    assert result.stderr.count("retrying in") == tries - 1


def test_via_is_short_for_connect_via(tmp_path: Path) -> None:
    script, counter = carrier_script(tmp_path, "short", "exit 3")
    result = run_exec("--via", str(script))
    check_report(result, f"via:{script}", CarrierFailure.CONFIG)
    assert counter.read_text() == "try\n"


def test_a_carrier_that_is_not_installed_here(tmp_path: Path) -> None:
    target = f"via:{tmp_path / 'no-such-carrier'} --flag"
    result = run_exec("--retries", "3", "--connect", target)
    check_report(result, target, CarrierFailure.NOT_INSTALLED,
                 f"cannot run the carrier '{tmp_path / 'no-such-carrier'}' here")
    assert "retrying" not in result.stderr


def test_real_far_side_config_error_is_config() -> None:
    result = run_exec("--remote-command", REMOTE, "--via", "env TTYSERVE_MAX_SESSIONS=0")
    check_report(result, "via:env TTYSERVE_MAX_SESSIONS=0", CarrierFailure.CONFIG)
    assert "TTYSERVE_MAX_SESSIONS" in result.stderr  # the far side's own words, shown


def test_real_far_side_that_refuses_the_invocation_is_usage() -> None:
    # the far side is run as `REMOTE serve --stdio --listen unix:/x`: a real usage error
    via = """sh -c 'exec "$0" "$@" --listen unix:/x'"""
    result = run_exec("--remote-command", REMOTE, "--via", via)
    check_report(result, f"via:{via}", CarrierFailure.USAGE)
    assert "--stdio serves stdin and stdout: it takes no --listen" in result.stderr


def test_real_far_side_whose_journal_is_held_is_lease(short_dir: Path) -> None:
    journal = short_dir / "journal"
    holder = start_server(short_dir, "--journal", str(journal))
    try:
        target = f"env TTYSERVE_JOURNAL={journal}"
        result = run_exec("--remote-command", REMOTE, "--retries", "1", "--via", target)
        check_report(result, f"via:{target}", CarrierFailure.LEASE)
        assert result.stderr.count("retrying in") == 1
    finally:
        holder.stop()


def test_real_ssh_to_a_closed_port_is_unreachable() -> None:
    if shutil.which("ssh") is None:
        pytest.skip("openssh-client is not installed (apt-get install openssh-client)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    target = f"ssh://127.0.0.1:{port}"
    result = run_exec("--retries", "1", "--connect", target)
    check_report(result, target, CarrierFailure.UNREACHABLE)
    shown = [line for line in result.stderr.splitlines()
             if line.startswith(f"{target}: ssh: connect to host 127.0.0.1 port {port}")]
    assert len(shown) == 2, result.stderr  # ssh's own words, once per try


def test_a_far_side_that_prints_before_the_protocol_is_named(tmp_path: Path) -> None:
    """A shell startup file that prints: what came first is shown, not parsed further."""
    script = tmp_path / "chatty"
    script.write_text('#!/bin/sh\necho "Welcome to $(hostname)!"\nexec "$@"\n')
    script.chmod(0o755)
    result = run_exec("--remote-command", REMOTE, "--via", str(script))
    assert result.returncode == ExecExit.FAILURE
    assert "the far side began with b'Welcome to " in result.stderr
    assert "not the protocol" in result.stderr


def test_an_interrupt_while_the_carrier_connects_ends_it_and_runs_nothing(
        tmp_path: Path) -> None:
    """Ctrl-C while ssh still connects: exec ends at once, the carrier with it, and the
    interrupt is not kept for the command (it never starts)."""
    pid_file = tmp_path / "carrier.pid"
    ran = tmp_path / "ran"
    script, _ = carrier_script(tmp_path, "slow", f"echo $$ > {pid_file}\nexec sleep 30")
    client = subprocess.Popen(
        ttyserve_command("exec", "--via", str(script), "--", "touch", str(ran)),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert client.stderr is not None
    assert b"carrier slow speaking" in client.stderr.readline()
    started = time.monotonic()
    client.send_signal(signal.SIGINT)
    _, err = client.communicate(timeout=20)
    assert client.returncode == ExecExit.INTERRUPTED, err
    assert time.monotonic() - started < 3
    assert b"SIGINT before the command started: nothing was started" in err
    carrier = int(pid_file.read_text())
    deadline = time.monotonic() + 5  # once we are gone, init reaps what we ended
    while Path(f"/proc/{carrier}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{carrier}").exists()
    assert not ran.exists()
