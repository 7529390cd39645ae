"""docs/http.md's recipes, run as written with curl and jq against a real server, byte for
byte: the coordinator a user would write from the docs."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import anyio
import pytest
from faults import fault_proxy
from http_api import ApiServer, need

pytestmark = [pytest.mark.timeout(90)]

DOCS = Path(__file__).resolve().parents[2] / "docs" / "http.md"


def recipes() -> dict[str, str]:
    """The doc's shell blocks that begin `# recipe: NAME`, by name."""
    found = {}
    for block in re.findall(r"```sh\n(.*?)```", DOCS.read_text(), re.S):
        first, _, rest = block.partition("\n")
        if first.startswith("# recipe: "):
            found[first.removeprefix("# recipe: ")] = rest
    return found


def run_recipe(name: str, api: ApiServer, cwd: Path, prelude: str = "",
               url: str | None = None) -> subprocess.CompletedProcess[bytes]:
    need("curl", "curl")
    need("jq", "jq")
    script = f"set -u\n{prelude}\n{recipes()[name]}"
    return subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, timeout=60,
                          env={**os.environ, "URL": url or api.url, "AUTH": api.auth})


def test_every_recipe_is_tested() -> None:
    assert set(recipes()) == {"run", "follow", "stdin", "cancel"}


def test_run_prints_the_output_and_exits_with_the_code(api: ApiServer, short_dir: Path) -> None:
    done = run_recipe("run", api, short_dir)
    assert (done.stdout, done.stderr, done.returncode) == (b"hello\n", b"oops\n", 3)


def test_stdin_takes_five_mebibytes_exactly(api: ApiServer, short_dir: Path) -> None:
    (short_dir / "input.bin").write_bytes(os.urandom(5 << 20))
    done = run_recipe("stdin", api, short_dir)
    assert (done.stdout, done.stderr, done.returncode) == (b"5242880\n", b"", 0)


def test_cancel_ends_the_session(api: ApiServer, short_dir: Path) -> None:
    done = run_recipe("cancel", api, short_dir)
    assert (done.stdout, done.returncode) == (b"204\nno_such_session\n", 0)


@pytest.mark.asyncio
async def test_follow_goes_on_across_cuts_every_line_once(api: ApiServer,
                                                          short_dir: Path) -> None:
    lines = 60_000
    # The job waits for the follower to attach, so that the recipe's stream paces it.
    prelude = (f'id=$(curl -sf -H "$AUTH" -d \'{{"argv": ["sh", "-c", "sleep 0.5; seq 1 '
               f'{lines}"], "pty": false}}\' "$URL/sessions" | jq -r .session)')
    port = api.url.split(":")[2].split("/")[0]
    async with fault_proxy(f"tcp:127.0.0.1:{port}") as proxy:
        url = f"http://127.0.0.1:{proxy.port}/api/v1"
        async with anyio.create_task_group() as tg:
            results: list[subprocess.CompletedProcess[bytes]] = []

            async def follow() -> None:
                results.append(await anyio.to_thread.run_sync(
                    lambda: run_recipe("follow", api, short_dir, prelude, url)))

            tg.start_soon(follow)
            for downstream in (60_000, 200_000, 420_000):  # three cuts, mid-stream
                with anyio.fail_after(30):
                    await proxy.fault_at(downstream, "cut")
    (done,) = results
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"".join(b"%d\n" % n for n in range(1, lines + 1))
    assert proxy.faults == ["cut", "cut", "cut"]
