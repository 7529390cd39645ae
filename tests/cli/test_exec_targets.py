"""`ttyserve exec --connect DOOR --target NAME|SELECTOR` (contracts.md, "One door to many
hosts"): one name is one session on that target, as plain `exec` (its exit status, its
signal); more names, a glob or LABEL=VALUE are the fan-out of the carriers section through
the one door (prefixed lines, summaries, the highest exit), TARGET being the target's name;
a selector that matches nothing, and the door's refusals, are 255 with a line that says so.

Each target's far side is this venv's `serve --stdio` (target_doors.py), and its processes
know which target they run on from $WHERE.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from helpers import ttyserve_command
from target_doors import door

from ttyserve.exitcodes import ExecExit

pytestmark = pytest.mark.timeout(90)
WEB = {"labels": {"role": "web"}}
HOSTS = {"web-1": WEB, "web-2": WEB, "db-1": {"labels": {"role": "db"}},
         "gone": {"remote_command": "/nonexistent/ttyserve"}}  # its carrier exits 127
# The exit status names the target: web-1 3, web-2 5, db-1 4.
SCRIPT = ('echo "out on $WHERE"; echo "err on $WHERE" >&2; '
          'case $WHERE in web-1) exit 3;; web-2) exit 5;; *) exit 4;; esac')


def run(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(ttyserve_command("exec", "--connect", address, *args),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)


def summaries(stderr: str) -> list[str]:
    return re.findall(r"(?m)^ttyserve: (\S+): (exit \d+|killed by signal \w+|failed: \w+)$",
                      stderr)  # type: ignore[return-value]


@pytest.mark.usefixtures("workers")
@pytest.mark.parametrize("path", ["direct", "anyio"])
def test_one_name_is_one_session_there_as_plain_exec(short_dir: Path, path: str) -> None:
    """Both of exec's ways (the loop-free start, and the event loop's, which a heartbeat
    takes) carry the target in their `open`."""
    way = ["--heartbeat", "5"] if path == "anyio" else []
    with door(short_dir, HOSTS) as server:
        address = server.addresses[0]
        result = run(address, *way, "--target", "web-2", "--", "sh", "-c", SCRIPT)
        assert (result.returncode, result.stdout) == (5, "out on web-2\n"), result.stderr
        assert "err on web-2\n" in result.stderr and summaries(result.stderr) == []
        killed = run(address, *way, "--target", "db-1", "--", "sh", "-c", "kill -TERM $$")
        assert killed.returncode == ExecExit.SIGNAL_BASE + 15, killed.stderr


@pytest.mark.usefixtures("workers")
def test_selectors_and_names_fan_out_through_the_door(short_dir: Path) -> None:
    with door(short_dir, HOSTS) as server:
        address = server.addresses[0]
        for given in (["role=web"], ["web-*"], ["web-1", "web-2"], ["web-1", "web-*"]):
            result = run(address, *[a for t in given for a in ("--target", t)], "--", "sh",
                         "-c", SCRIPT)
            assert result.returncode == 5, (given, result.stderr)  # the highest
            assert sorted(result.stdout.splitlines()) == [
                "web-1: out on web-1", "web-2: out on web-2"], given
            assert "web-1: err on web-1\n" in result.stderr
            assert summaries(result.stderr) == [("web-1", "exit 3"), ("web-2", "exit 5")]
        # A selector always fans out, even when it matches one target.
        one = run(address, "--target", "role=db", "--json", "--", "sh", "-c", SCRIPT)
        assert one.returncode == 4, one.stderr
        events = [json.loads(line) for line in one.stdout.splitlines()]
        assert {event["target"] for event in events} == {"db-1"}
        assert events[-1]["event"] == "exit" and events[-1]["code"] == 4
        assert summaries(one.stderr) == [("db-1", "exit 4")]


@pytest.mark.usefixtures("workers")
def test_a_selector_that_matches_nothing_runs_nothing(short_dir: Path) -> None:
    with door(short_dir, HOSTS) as server:
        for selector in ("nope-*", "role=nope"):
            result = run(server.addresses[0], "--target", "web-1", "--target", selector, "--",
                         "echo", "ran")
            assert result.returncode == ExecExit.FAILURE
            assert result.stdout == ""
            assert f"--target '{selector}' matches no target" in result.stderr


@pytest.mark.usefixtures("workers")
def test_the_doors_refusals_are_255_with_their_code(short_dir: Path) -> None:
    with door(short_dir, HOSTS) as server:
        address = server.addresses[0]
        unknown = run(address, "--target", "nope", "--json", "--", "true")
        assert unknown.returncode == ExecExit.FAILURE
        assert "the server refused: no_such_target" in unknown.stderr
        assert "not retriable" in unknown.stderr
        (event,) = [json.loads(line) for line in unknown.stdout.splitlines()]
        assert (event["event"], event["code"], event["retriable"]) == (
            "error", "no_such_target", False)
        gone = run(address, "--target", "gone", "--", "true")
        assert gone.returncode == ExecExit.FAILURE
        assert re.search(r"target_unreachable: target gone: not_installed: .*"
                         r"\(not retriable\)", gone.stderr), gone.stderr
        # In a fan-out they are the targets' own failures; the others run.
        many = run(address, "--target", "web-1", "--target", "nope", "--target", "gone",
                   "--", "sh", "-c", SCRIPT)
        assert many.returncode == ExecExit.FAILURE
        assert many.stdout == "web-1: out on web-1\n"
        assert summaries(many.stderr) == [("web-1", "exit 3"),
                                          ("nope", "failed: no_such_target"),
                                          ("gone", "failed: target_unreachable")]


@pytest.mark.parametrize("args, said", [
    (["--target", "web-*", "-t"], "-t works with one target, not --target web-*"),
    (["--target", "role=web", "--detachable"], "--detachable works with one target"),
    (["--target", "web-1", "--connect", "unix:/nonexistent/other.sock"],
     "--target runs through one door"),
    (["--target", "a=b=c"], "is not label=value"),
])
def test_what_cannot_fan_out_is_refused_before_anything_runs(args: list[str],
                                                             said: str) -> None:
    result = run("unix:/nonexistent/door.sock", *args, "--", "true")
    assert result.returncode == ExecExit.FAILURE
    assert said in result.stderr
