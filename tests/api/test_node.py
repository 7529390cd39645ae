"""A coordinator in another language: examples/coordinator.mjs on Node's built-in fetch runs a
command, follows its output across cuts, and exits with its code."""

from __future__ import annotations

import subprocess
from pathlib import Path

import anyio
import pytest
from faults import fault_proxy
from http_api import ApiServer, need

pytestmark = [pytest.mark.timeout(90), pytest.mark.asyncio]

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "coordinator.mjs"


async def test_node_follows_a_command_across_cuts_and_exits_with_its_code(
        api: ApiServer) -> None:
    node = need("node", "nodejs")
    lines = 80_000
    command = f"sleep 0.3; seq 1 {lines}; echo done >&2; exit 5"
    port = api.url.split(":")[2].split("/")[0]
    async with fault_proxy(f"tcp:127.0.0.1:{port}") as proxy:
        url = f"http://127.0.0.1:{proxy.port}/api/v1"
        done: list[subprocess.CompletedProcess[bytes]] = []

        async def coordinate() -> None:
            done.append(await anyio.run_process(
                [node, str(SCRIPT), url, api.token, "--", "sh", "-c", command], check=False))

        async with anyio.create_task_group() as tg:
            tg.start_soon(coordinate)
            for downstream in (100_000, 300_000, 600_000):
                with anyio.fail_after(30):
                    await proxy.fault_at(downstream, "cut")
    (run,) = done
    assert run.stdout == b"".join(b"%d\n" % n for n in range(1, lines + 1))
    stderr = run.stderr.decode().splitlines()  # (the command's, and the coordinator's)
    assert stderr[-1] == '[exit {"type":"exit","code":5}]' and stderr.count("done") == 1, stderr
    assert proxy.faults == ["cut"] * 3
    # Each cut was noticed (one may break a request and the retry's reused connection).
    assert sum("the stream broke" in line for line in stderr) >= 3, stderr
    assert run.returncode == 5
