"""Usage, from real subprocesses: help for people, and each command's own usage exit code."""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

import pytest
from helpers import ttyserve_command

from ttyserve.cli.main import build_parser
from ttyserve.exitcodes import ExecExit, ServeExit

pytestmark = pytest.mark.timeout(60)


def run(*args: str, short_dir: Path) -> subprocess.CompletedProcess[str]:
    # Nothing listens at this address: a usage error must be caught before any connection.
    env = {**os.environ, "TTYSERVE_CONNECT": f"unix:{short_dir / 'nobody.sock'}"}
    return subprocess.run(ttyserve_command(*args), capture_output=True, timeout=20, text=True,
                          stdin=subprocess.DEVNULL, env=env)


@pytest.mark.parametrize("args", [
    ["--bogus"],  # unknown flags, which argparse reports through the top-level parser
    ["--bogus", "--", "true"],
    ["--json", "-x"],
    ["--retries", "x"],  # bad values
    ["--retries", "-1"],
    ["--env", "NO_EQUALS_SIGN"],
    ["--retries"],  # missing values
    ["--connect"],
    ["--cwd"],
    ["-t", "-T"],  # exclusive flags
    ["--c", "x"],  # ambiguous abbreviation
], ids=" ".join)
def test_every_usage_error_of_exec_exits_255(short_dir: Path, args: list[str]) -> None:
    result = run("exec", *args, short_dir=short_dir)
    assert result.returncode == ExecExit.FAILURE, result.stderr
    assert "ttyserve exec: error: " in result.stderr
    assert result.stderr.startswith("usage: ttyserve exec ")


@pytest.mark.parametrize("args", [
    ["serve", "--bogus"],
    ["serve", "--linger"],
    ["sessions", "--bogus"],
    ["sessions", "--limit", "x"],
    [],
    ["bogus"],
], ids=lambda args: " ".join(args) or "nothing")
def test_usage_errors_of_serve_and_sessions_exit_2(short_dir: Path, args: list[str]) -> None:
    result = run(*args, short_dir=short_dir)
    assert result.returncode == ServeExit.USAGE, result.stderr
    assert "error: " in result.stderr


def test_help_is_written_for_users(short_dir: Path) -> None:
    result = run("--help", short_dir=short_dir)
    assert result.returncode == 0
    assert "sys.exit" not in result.stdout
    assert result.stdout.split("\n\n")[1].startswith("Run processes on this host")
    for command in ("serve", "exec", "sessions"):
        assert f"    {command} " in result.stdout


def test_every_flag_of_every_command_has_help() -> None:
    for name, command in build_parser().subcommands.items():
        for action in command._actions:
            what = f"{name} {'/'.join(action.option_strings) or action.dest}"
            assert action.help and action.help != argparse.SUPPRESS, what


def test_exec_help_explains_env_cwd_and_retries(short_dir: Path) -> None:
    lines = run("exec", "--help", short_dir=short_dir).stdout.splitlines()
    for flag in ("--env K=V", "--cwd DIR", "--retries N"):
        line = next(line for line in lines if line.strip().startswith(flag))
        assert line.strip() != flag  # its help follows on the same line
