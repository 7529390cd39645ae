"""Hardening acceptance 2: a restricted server refuses other commands and loader variables."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import ServerProcess, start_server

from ttyserve.client import run
from ttyserve.errors import RequestError

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]


@pytest.fixture
def restricted(short_dir: Path) -> Iterator[ServerProcess]:
    server = start_server(short_dir, "--allow-command", "/bin/echo", "--allow-env", "GREETING",
                          "--allow-env", "LD_*")
    try:
        yield server
    finally:
        server.stop()


async def refused(server: ServerProcess, argv: list[str], env: dict[str, str] | None = None,
                  ) -> str:
    with pytest.raises(RequestError) as info:
        await run(argv, address=server.addresses[0], env=env)
    assert info.value.code == "forbidden"
    return info.value.message


async def test_allowed_command_runs(restricted: ServerProcess) -> None:
    result = await run(["/bin/echo", "ok"], address=restricted.addresses[0],
                       env={"GREETING": "hi"})
    assert (result.status.code, result.stdout) == (0, b"ok\n")


@pytest.mark.parametrize("argv", [["sh", "-c", "id"], ["/bin/sh"], ["echo", "x"],
                                  ["/bin/echo/../sh"]])
async def test_other_commands_are_forbidden(restricted: ServerProcess, argv: list[str]) -> None:
    assert argv[0] in await refused(restricted, argv)


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "BASH_ENV",
                                  "PATH"])
async def test_loader_variables_are_forbidden_even_if_listed(restricted: ServerProcess,
                                                             name: str) -> None:
    assert name in await refused(restricted, ["/bin/echo"], {name: "/tmp/evil"})


async def test_env_outside_allow_env_is_forbidden(restricted: ServerProcess) -> None:
    assert "OTHER" in await refused(restricted, ["/bin/echo"], {"OTHER": "1"})


async def test_nul_bytes_are_refused_everywhere(short_dir: Path) -> None:
    server = start_server(short_dir)
    try:
        with pytest.raises(RequestError) as info:
            await run(["/bin/echo", "a\0b"], address=server.addresses[0])
        assert info.value.code == "bad_request"
    finally:
        server.stop()
