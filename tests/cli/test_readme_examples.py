"""The README's examples run as written (issue 41): every block of its "Examples" section,
from the checkout's root, against a server on the default socket as `make serve` starts it;
a shell block's command prints the lines shown under it, and a Python block is a program
that ends with 0."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import start_server

ROOT = Path(__file__).resolve().parents[2]
IN_PROCESS = [Path("/tmp/my-ttyserve.sock"), Path("/tmp/my-ttyserve.sock.lock")]
pytestmark = pytest.mark.timeout(180)


def examples() -> list[tuple[str, str]]:
    """The section's fenced blocks: (language, text)."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Examples"):readme.index("## Documentation")]
    return re.findall(r"```(\w+)\n(.*?)```", section, re.S)


def test_every_example_of_the_readme_runs_as_written(short_dir: Path) -> None:
    runtime = short_dir / "rt"
    runtime.mkdir(mode=0o700)
    environ = {"XDG_RUNTIME_DIR": str(runtime), "TTYSERVE_WARM": "0"}
    blocks = examples()
    assert [language for language, _ in blocks] == ["sh", "sh", "sh", "python", "python",
                                                    "python", "python"]
    server = start_server(short_dir, "--workers=auto", listen=[], expect_lines=1,
                          env=environ)
    try:
        assert server.addresses == [f"unix:{runtime / 'ttyserve.sock'}"]
        for language, text in blocks:
            if language == "sh":
                run_shell(text, environ)
            else:
                program = short_dir / "example.py"
                program.write_text(text)
                ran = subprocess.run([sys.executable, str(program)], cwd=ROOT, timeout=60,
                                     capture_output=True, text=True,
                                     env={**_environ(), **environ})
                assert ran.returncode == 0 and ran.stdout, (text, ran.stdout, ran.stderr)
    finally:
        server.stop()
        for made in IN_PROCESS:  # (what the in-process server's example bound)
            made.unlink(missing_ok=True)


def run_shell(text: str, environ: dict[str, str]) -> None:
    """A block's command (its first line) and the lines it shows it printing (the rest);
    an interactive one (nothing shown) is given a line to run and `exit`."""
    command, *shown = text.rstrip("\n").split("\n")
    assert command.startswith(".venv/bin/ttyserve ")
    typed = None if shown else "echo typed\nexit\n"
    ran = subprocess.run(["sh", "-c", command], cwd=ROOT, timeout=60, capture_output=True,
                         text=True, input=typed or "", env={**_environ(), **environ})
    if typed is not None:
        assert (ran.returncode, ran.stdout.splitlines()[-1:]) == (0, ["typed"]), ran.stderr
        return
    pid = re.compile(r'"pid":\d+')
    assert [pid.sub('"pid":N', line) for line in ran.stdout.splitlines()] == [
        pid.sub('"pid":N', line) for line in shown], (command, ran.stderr)


def _environ() -> dict[str, str]:
    import os

    return {key: value for key, value in os.environ.items() if key != "TTYSERVE_CONNECT"}
