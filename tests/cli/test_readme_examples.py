"""The README's examples run as written (issue 41): every block of its "Examples" section,
from the checkout's root, against a server on the default socket as `make serve` starts it;
a shell block's command prints the lines shown under it, and a Python block is a program
that ends with 0."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from helpers import start_server

from ttyserve.client import connect

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
        assert not IN_PROCESS[0].exists()  # the in-process server's socket file, removed
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


def section_block(title: str, starts: str) -> str:
    """The first block of the README's ``title`` section whose text starts with ``starts``."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index(title):]
    section = section[:section.index("\n## ", 1)]
    (block,) = [b for b in re.findall(r"```sh\n(.*?)```", section, re.S) if b.startswith(starts)]
    return block


@pytest.mark.usefixtures("workers")
def test_the_readmes_token_joins_the_server_the_page_the_api_and_share(
        short_dir: Path) -> None:
    """The token made as the README says is one the server takes (its mode), and the same
    file serves the page's URL, the HTTP API's curl lines and `share` (issue 41, item 4). The
    README's port, 7681, is the one this server got."""
    made, serve, page = section_block("## A terminal in the browser", "(umask").splitlines()
    subprocess.run(["sh", "-c", made], cwd=short_dir, check=True, timeout=10)
    token = short_dir / "token"
    assert token.stat().st_mode & 0o777 == 0o600
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}\n", token.read_text())  # whole in a URL's fragment
    assert "--token-file $PWD/token" in serve
    server = start_server(short_dir, "--token-file", str(token),
                          listen=["ws:127.0.0.1:0"])
    here = server.addresses[0].removeprefix("ws:")

    def as_written(line: str, **options: object) -> subprocess.CompletedProcess[str]:
        line = line.replace("127.0.0.1:7681", here).replace(".venv/bin/", f"{ROOT}/.venv/bin/")
        return subprocess.run(["sh", "-c", line], cwd=short_dir, capture_output=True,
                              text=True, timeout=30, **options)  # type: ignore[call-overload, no-any-return]

    try:
        secret = token.read_text().strip()
        assert as_written(page).stdout.strip() == f"http://{here}/#token={secret}"
        api = as_written(section_block("## Over HTTP", "id=$(curl"))
        events = [line for line in api.stdout.splitlines() if line]
        assert events and '"exit"' in events[-1], (api.stdout, api.stderr)

        async def detached() -> str:
            async with connect(server.addresses[0], token=secret, multiplex=True) as conn:
                session = await conn.spawn(["sleep", "30"], pty=False, detachable=True)
                await session.detach()
            return session.id or ""

        session_id = anyio.run(detached)
        share = section_block("## Sessions that outlive", ".venv/bin/ttyserve share")
        shared = as_written(share.splitlines()[0].replace("s3Cq7...Zg", session_id))
        assert shared.returncode == 0, shared.stderr
        assert "#grant=" in shared.stdout and f"&session={session_id}" in shared.stdout
    finally:
        server.stop()
