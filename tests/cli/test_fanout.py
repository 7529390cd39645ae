"""`ttyserve exec` on many targets (contracts.md, fan-out): whole prefixed lines, the exit
rule, summaries in the order given, --hosts, --parallel, --json, and the progress line.

Each target is a local `serve --stdio` reached through `--via env A=N`, so the command
tells the targets apart by $A (the far side's environment).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import pty
import re
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pyte
import pytest
from helpers import ttyserve_command

from ttyserve.exitcodes import ExecExit

pytestmark = pytest.mark.timeout(60)
REMOTE = str(Path(sys.executable).parent / "ttyserve")


def targets(count: int) -> list[str]:
    return [f"via:env A={n}" for n in range(1, count + 1)]


def fan(*args: str, connect: list[str], stdin: bytes = b"",
        timeout: float = 40) -> subprocess.CompletedProcess[bytes]:
    given = [arg for target in connect for arg in ("--connect", target)]
    return subprocess.run(
        ttyserve_command("exec", "--remote-command", REMOTE, *given, *args), input=stdin,
        capture_output=True, timeout=timeout)


def summaries(stderr: bytes) -> list[str]:
    return [line for line in stderr.decode().splitlines()
            if re.fullmatch(r"ttyserve: .+: (exit \d+|killed by signal \w+|failed: \w+)", line)]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_two_targets_2000_lines_each_whole_and_prefixed() -> None:
    # Each line is written in two pieces, on both streams at once, by both targets at once.
    script = ('i=0; while [ $i -lt 2000 ]; do printf "line $i of $A "; '
              'echo "$(printf "%0100d" $i)"; echo "err $i of $A" >&2; i=$((i+1)); done')
    result = fan("--", "sh", "-c", script, connect=targets(2))
    assert result.returncode == 0, result.stderr[-2000:]
    for stream, pattern in ((result.stdout, r"via:env A=(\d): line (\d+) of \1 (\d{100})"),
                            (result.stderr, r"via:env A=(\d): err (\d+) of \1")):
        seen: dict[str, list[int]] = {"1": [], "2": []}
        for line in stream.decode().splitlines():
            if line.startswith("ttyserve: "):
                continue  # the summaries
            match = re.fullmatch(pattern, line)
            assert match, f"torn or foreign line: {line!r}"
            seen[match[1]].append(int(match[2]))
            if match.lastindex == 3:
                assert int(match[3]) == int(match[2])
        assert seen == {"1": list(range(2000)), "2": list(range(2000))}


def test_a_command_not_found_is_127_as_exec_says_it_and_said_at_once() -> None:
    result = fan("--json", "--", "no-such-program", connect=targets(2))
    assert result.returncode == ExecExit.NOT_FOUND
    assert summaries(result.stderr) == [f"ttyserve: {t}: exit 127" for t in targets(2)]
    for target in targets(2):
        assert f"ttyserve: {target}: spawn_failed: " in result.stderr.decode()
    errors = [json.loads(line) for line in result.stdout.splitlines()]
    assert sorted((e["event"], e["target"], e["code"]) for e in errors) == [
        ("error", t, "spawn_failed") for t in targets(2)]


def test_a_last_line_without_newline_gets_one() -> None:
    result = fan("--", "sh", "-c", "printf 'no newline from %s' $A", connect=targets(2))
    assert sorted(result.stdout.splitlines()) == [b"via:env A=1: no newline from 1",
                                                  b"via:env A=2: no newline from 2"]


def test_an_unreachable_target_does_not_stop_the_others() -> None:
    dead = f"tcp:127.0.0.1:{closed_port()}"
    result = fan("--", "sh", "-c", "echo ok $A", connect=[targets(2)[0], dead, targets(2)[1]])
    assert result.returncode == ExecExit.FAILURE
    assert sorted(result.stdout.splitlines()) == [b"via:env A=1: ok 1", b"via:env A=2: ok 2"]
    assert summaries(result.stderr) == ["ttyserve: via:env A=1: exit 0",
                                        f"ttyserve: {dead}: failed: unreachable",
                                        "ttyserve: via:env A=2: exit 0"]
    assert f"ttyserve: {dead}: unreachable: cannot connect" in result.stderr.decode()


@pytest.mark.parametrize(("codes", "expected"), [
    ("0 0 0", 0), ("0 3 7", 7), ("7 0 3", 7), ("0 KILL 7", 128 + 9), ("0 0 FAIL", 255),
])
def test_the_exit_status_is_0_or_the_highest(codes: str, expected: int, tmp_path: Path) -> None:
    endings = codes.split()
    script = ('eval "c=\\${C$A}"; case $c in KILL) kill -9 $$;; *) exit $c;; esac')
    connect = [f"via:env {' '.join(f'C{n}={c}' for n, c in enumerate(endings, 1))} A={n}"
               for n in range(1, len(endings) + 1)]
    if "FAIL" in endings:  # a carrier that ends before welcome
        failing = tmp_path / "carrier"
        failing.write_text("#!/bin/sh\nexit 4\n")
        failing.chmod(0o755)
        connect[endings.index("FAIL")] = f"via:{failing}"
    result = fan("--", "sh", "-c", script, connect=connect)
    assert result.returncode == expected, result.stderr
    wanted = [{"KILL": "killed by signal KILL", "FAIL": "failed: lease"}.get(c, f"exit {c}")
              for c in endings]
    assert summaries(result.stderr) == [f"ttyserve: {target}: {end}"
                                        for target, end in zip(connect, wanted, strict=True)]


def test_summaries_come_in_the_order_given_not_the_order_of_ending(tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    # The first target ends last: it waits for the third to create the flag.
    script = (f'case $A in 1) while [ ! -e {flag} ]; do sleep 0.02; done;; '
              f'3) touch {flag};; esac; exit $A')
    result = fan("--", "sh", "-c", script, connect=targets(3))
    assert summaries(result.stderr) == [f"ttyserve: via:env A={n}: exit {n}" for n in (1, 2, 3)]
    assert result.returncode == 3


def test_hosts_file_with_comments_and_blank_lines(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("# the fleet\n\nvia:env A=2\n   \n  # indented comment\n"
                     "  via:env A=3  \nvia:env A=1\n")
    result = fan("--hosts", str(hosts), "--", "sh", "-c", "echo $A", connect=["via:env A=1"])
    assert result.returncode == 0, result.stderr
    assert summaries(result.stderr) == [f"ttyserve: via:env A={n}: exit 0" for n in (1, 2, 3)]
    assert sorted(result.stdout.splitlines()) == [b"via:env A=%d: %d" % (n, n) for n in (1, 2, 3)]


def test_a_bad_line_in_the_hosts_file_is_named(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("via:env A=1\nweb1\n")
    result = fan("--hosts", str(hosts), "--", "true", connect=[])
    assert result.returncode == ExecExit.FAILURE
    assert f"{hosts}:2: address 'web1'" in result.stderr.decode()


@pytest.mark.parametrize("parallel", [1, 3])
def test_parallel_bounds_how_many_run_at_once(parallel: int, tmp_path: Path) -> None:
    log = tmp_path / "log"
    # With room for all three, each waits until all have started: only parallelism ends it.
    script = (f'echo "start $A" >> {log}; '
              f'while [ {parallel} -gt 1 ] && [ $(grep -c start {log}) -lt 3 ]; do '
              f'sleep 0.02; done; sleep 0.2; echo "end $A" >> {log}')
    result = fan("--parallel", str(parallel), "--", "sh", "-c", script, connect=targets(3))
    assert result.returncode == 0, result.stderr
    events = log.read_text().split("\n")[:-1]
    running = peak = 0
    for event in events:
        running += 1 if event.startswith("start") else -1
        peak = max(peak, running)
    assert peak == parallel, events
    if parallel == 1:
        assert events == ["start 1", "end 1", "start 2", "end 2", "start 3", "end 3"]


def test_parallel_is_bounded_by_the_descriptors_this_process_may_open(tmp_path: Path) -> None:
    log = tmp_path / "log"
    script = f'echo "start $A" >> {log}; sleep 0.1; echo "end $A" >> {log}'
    given = [arg for target in targets(16) for arg in ("--connect", target)]

    def hundred_descriptors() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))

    result = subprocess.run(
        ttyserve_command("exec", "--remote-command", REMOTE, *given, "--parallel", "16",
                         "--", "sh", "-c", script),
        capture_output=True, timeout=60, preexec_fn=hundred_descriptors)
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert "may open 100 (ulimit -n): running at most 9 at once" in result.stderr.decode()
    running = peak = 0
    for event in log.read_text().splitlines():
        running += 1 if event.startswith("start") else -1
        peak = max(peak, running)
    assert 1 <= peak <= 9


def test_a_target_lost_after_it_started_is_never_retried(tmp_path: Path) -> None:
    runs, flag = tmp_path / "runs", tmp_path / "opened"
    # Target 1's command waits until we have seen it open, then kills its far side (the
    # serve that is its parent), so the connection is lost after `opened`, never before.
    script = (f'echo "ran $A" >> {runs}; case $A in 1) echo up; '
              f'while [ ! -e {flag} ]; do sleep 0.01; done; kill -9 $PPID; sleep 5;; esac')
    given = [arg for target in targets(2) for arg in ("--connect", target)]
    client = subprocess.Popen(
        ttyserve_command("exec", "--remote-command", REMOTE, *given, "--json", "--retries",
                         "2", "--", "sh", "-c", script),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert client.stdout is not None
    events = []
    for line in client.stdout:
        events.append(json.loads(line))
        if events[-1].get("target") == "via:env A=1" and events[-1]["event"] == "stdout":
            flag.touch()
    _, err = client.communicate(timeout=30)
    assert client.returncode == ExecExit.FAILURE, err
    assert sorted(runs.read_text().splitlines()) == ["ran 1", "ran 2"]  # once each
    [error] = [event for event in events if event["event"] == "error"]
    assert (error["target"], error["class"], error["retriable"]) == ("via:env A=1", "lost",
                                                                      False)
    assert "retrying" not in err.decode()
    assert summaries(err) == ["ttyserve: via:env A=1: failed: lost",
                              "ttyserve: via:env A=2: exit 0"]


def test_a_closed_stdout_stops_every_target_and_exits_141() -> None:
    given = [arg for target in targets(2) for arg in ("--connect", target)]
    client = subprocess.Popen(
        ttyserve_command("exec", "--remote-command", REMOTE, *given, "--", "yes"),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert client.stdout is not None and client.stderr is not None
    assert client.stdout.readline().endswith(b": y\n")
    client.stdout.close()  # as `| head -1` does
    err = client.stderr.read()
    assert client.wait(timeout=30) == ExecExit.SIGNAL_BASE + signal.SIGPIPE, err
    assert len(summaries(err)) == 2 and b"Traceback" not in err


def test_json_events_carry_their_target() -> None:
    result = fan("--json", "--", "sh", "-c", "echo hi $A; exit $A", connect=targets(2))
    assert result.returncode == 2
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert {e["event"] for e in events} == {"opened", "stdout", "exit"}
    for n in (1, 2):
        mine = [e for e in events if e["target"] == f"via:env A={n}"]
        assert [e["event"] for e in mine] == ["opened", "stdout", "exit"]
        assert base64.b64decode(mine[1]["data"]) == f"hi {n}\n".encode()
        assert mine[2]["code"] == n
    assert len(events) == 6


def test_stdin_is_not_read_each_target_gets_an_empty_one() -> None:
    result = fan("--", "sh", "-c", "cat; echo done $A", stdin=b"for nobody\n",
                 connect=targets(2))
    assert result.returncode == 0
    assert sorted(result.stdout.splitlines()) == [b"via:env A=1: done 1", b"via:env A=2: done 2"]


def test_t_is_refused_with_many_targets_before_anything_runs(tmp_path: Path) -> None:
    touched = tmp_path / "ran"
    carrier = tmp_path / "carrier"
    carrier.write_text(f"#!/bin/sh\ntouch {touched}\nexit 3\n")
    carrier.chmod(0o755)
    result = fan("-t", "--", "true", connect=[f"via:{carrier}", "via:env A=1"])
    assert result.returncode == ExecExit.FAILURE
    assert b"-t works with one target" in result.stderr
    assert not touched.exists()


def test_one_target_is_not_prefixed_and_has_no_summary() -> None:
    result = fan("--", "sh", "-c", "echo plain", connect=targets(1))
    assert (result.returncode, result.stdout) == (0, b"plain\n")
    assert summaries(result.stderr) == []


def test_a_second_interrupt_cancels_every_target(tmp_path: Path) -> None:
    script = "trap 'echo got INT $A' INT; echo up $A; while :; do sleep 0.05; done"
    process = subprocess.Popen(
        ttyserve_command("exec", "--remote-command", REMOTE, "--via", "env A=1",
                         "--via", "env A=2", "--", "sh", "-c", script),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True)
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline(), process.stdout.readline()]
        assert sorted(lines) == [b"via:env A=1: up 1\n", b"via:env A=2: up 2\n"]
        os.killpg(process.pid, signal.SIGINT)  # as a terminal would: the whole group
        lines = [process.stdout.readline(), process.stdout.readline()]
        assert sorted(lines) == [b"via:env A=1: got INT 1\n", b"via:env A=2: got INT 2\n"]
        os.killpg(process.pid, signal.SIGINT)
        _out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == ExecExit.INTERRUPTED
    assert summaries(err) == ["ttyserve: via:env A=1: failed: cancelled",
                              "ttyserve: via:env A=2: failed: cancelled"]


def test_a_progress_line_at_the_foot_of_a_terminal_gone_at_the_end(tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    script = f"while [ ! -e {flag} ]; do sleep 0.02; done; echo done $A"
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 20, 100, 0, 0))
    process = subprocess.Popen(
        ttyserve_command("exec", "--remote-command", REMOTE, "--via", "env A=1",
                         "--via", "env A=2", "--", "sh", "-c", script),
        stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal)
    os.close(terminal)
    screen = pyte.Screen(100, 20)
    stream = pyte.ByteStream(screen)
    seen = b""
    try:
        deadline = time.monotonic() + 30
        while not (flag.exists() and not select.select([controller], [], [], 0)[0]
                   and process.poll() is not None):
            ready, _, _ = select.select([controller], [], [], max(deadline - time.monotonic(), 0))
            assert ready, f"no output in time; so far: {seen!r}"
            try:
                data = os.read(controller, 65536)
            except OSError:  # EIO: the terminal's last writer has gone
                break
            seen += data
            stream.feed(data)
            if b"0 done, 2 running, 0 failed, of 2" in seen and not flag.exists():
                foot = [line.rstrip() for line in screen.display if line.strip()][-1]
                assert foot == "ttyserve: 0 done, 2 running, 0 failed, of 2"
                flag.touch()
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        os.close(controller)
    assert flag.exists(), seen
    shown = [line.rstrip() for line in screen.display if line.strip()]
    assert sorted(shown[:2]) == ["via:env A=1: done 1", "via:env A=2: done 2"]
    assert shown[2:] == ["ttyserve: via:env A=1: exit 0", "ttyserve: via:env A=2: exit 0"]
    assert process.returncode == 0
