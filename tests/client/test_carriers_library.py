"""The library through carriers, under asyncio and trio: `connect("via:...")`, the carrier
reaped on every way out, and `run_many` / `fan_out` (contracts.md, carriers)."""

from __future__ import annotations

import errno
import os
import resource
import socket
import sys
from pathlib import Path

import anyio
import pytest
from helpers import SH, children_of

from ttyserve import CarrierError, CarrierFailure, connect, fan_out, run, run_many
from ttyserve.client.fanout import CarrierLine, Finished, Opened, Output
from ttyserve.errors import OutOfResources

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]
REMOTE = str(Path(sys.executable).parent / "ttyserve")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend


def my_children() -> set[int]:
    """Our children, zombies included: a carrier not reaped would show here."""
    return set(children_of(os.getpid()))


def gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


async def test_run_through_a_carrier() -> None:
    before = my_children()
    result = await run([SH, "-c", "cat; echo err >&2; exit 4"], address="via:env",
                       input=b"through the pipes\n", remote_command=REMOTE)
    assert (result.returncode, result.stdout, result.stderr) == (
        4, b"through the pipes\n", b"err\n")
    assert my_children() == before


async def test_leaving_mid_session_cancels_the_far_side_and_reaps_the_carrier() -> None:
    before = my_children()
    async with connect("via:env", remote_command=REMOTE) as conn:
        session = await conn.spawn([SH, "-c", "echo up; exec sleep 600"], pty=False)
        assert await session.receive() is not None  # it runs
        assert my_children() - before  # the carrier is our child
        assert session.pid is not None and not gone(session.pid)
    assert my_children() == before
    assert gone(session.pid)  # the far side saw EOF, cancelled and reaped it


async def test_cancelled_from_outside_the_carrier_is_still_reaped() -> None:
    before = my_children()
    pid = None
    with anyio.CancelScope() as scope:
        async with connect("via:env", remote_command=REMOTE) as conn:
            session = await conn.spawn([SH, "-c", "echo up; exec sleep 600"], pty=False)
            pid = session.pid
            await session.receive()
            scope.cancel()
            await anyio.sleep_forever()
    assert my_children() == before
    assert pid is not None and gone(pid)


async def test_an_error_in_the_block_still_reaps_the_carrier() -> None:
    before = my_children()
    with pytest.raises(LookupError):
        async with connect("via:env", remote_command=REMOTE) as conn:
            await conn.spawn([SH, "-c", "sleep 600"], pty=False)
            raise LookupError("the caller's own error, unwrapped")
    assert my_children() == before


async def test_a_carrier_that_fails_early_raises_carrier_error(tmp_path: Path) -> None:
    before = my_children()
    lines: list[bytes] = []

    async def collect(line: bytes) -> None:
        lines.append(line)

    with pytest.raises(CarrierError) as caught:
        async with connect("via:sh -c 'echo no ttyserve here >&2; exit 127' carrier",
                           carrier_stderr=collect) as conn:
            await conn.spawn(["true"])
    assert caught.value.failure is CarrierFailure.NOT_INSTALLED
    assert (caught.value.retriable, caught.value.status) == (False, 127)
    assert lines == [b"no ttyserve here"]
    assert my_children() == before


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_run_many_gives_one_result_per_target_in_the_order_given(tmp_path: Path) -> None:
    dead = f"tcp:127.0.0.1:{closed_port()}"
    broken = tmp_path / "carrier"
    broken.write_text("#!/bin/sh\necho held >&2\nexit 4\n")
    broken.chmod(0o755)
    targets = ["via:env A=2", dead, f"via:{broken}", "via:env A=1"]
    results = await run_many([SH, "-c", "echo out $A; echo err $A >&2; exit $A"], targets,
                             parallel=2, remote_command=REMOTE)
    assert [r.target for r in results] == targets
    assert [(r.exit_code, r.failure, r.summary) for r in results] == [
        (2, None, "exit 2"), (255, "unreachable", "failed: unreachable"),
        (255, "lease", "failed: lease"), (1, None, "exit 1")]
    assert (results[0].stdout, results[0].stderr) == (b"out 2\n", b"err 2\n")
    assert results[2].carrier_stderr == b"held\n"
    assert isinstance(results[2].error, CarrierError)


async def test_fan_out_streams_events_as_they_come(tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    # Target 1 waits until the consumer has seen target 2's output and made the flag.
    script = f"case $A in 1) while [ ! -e {flag} ]; do sleep 0.02; done;; esac; echo hi $A"
    seen: list[tuple[str, str]] = []
    async with fan_out([SH, "-c", script], ["via:env A=1", "via:env A=2"],
                       remote_command=REMOTE) as fan:
        assert fan.targets == ["via:env A=1", "via:env A=2"]
        async for event in fan:
            seen.append((type(event).__name__, event.target))
            if isinstance(event, Opened):
                assert event.target in fan.running  # its session, while it runs
            if isinstance(event, Finished) and event.target == "via:env A=2":
                assert not flag.exists()  # target 1 is still running: this is live
                assert set(fan.running) <= {"via:env A=1"}  # (it may not have opened yet)
                flag.touch()
            if isinstance(event, Output):
                assert event.data == f"hi {event.target[-1]}\n".encode()
            assert not isinstance(event, CarrierLine)
    for target in ("via:env A=1", "via:env A=2"):
        mine = [kind for kind, name in seen if name == target]
        assert mine == [Opened.__name__, Output.__name__, Finished.__name__]
    assert seen.index(("Finished", "via:env A=2")) < seen.index(("Output", "via:env A=1"))


async def test_out_of_descriptors_is_no_resources_not_a_missing_carrier() -> None:
    open_now = {int(fd) for fd in os.listdir("/proc/self/fd")}
    limit, free = 0, 0
    while free < 2:  # room for one pipe of the carrier's three, so the second fails
        free += limit not in open_now
        limit += 1
    before = my_children()
    saved = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, saved[1]))
    try:
        [result] = await run_many(["true"], ["via:env A=1"], remote_command=REMOTE)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, saved)
    assert (result.failure, result.exit_code) == ("no_resources", 255)
    assert isinstance(result.error, OutOfResources) and result.error.errno == errno.EMFILE
    assert "cannot start the carrier 'env'" in str(result.error)
    assert {int(fd) for fd in os.listdir("/proc/self/fd")} == open_now  # the pipe closed
    assert my_children() == before


async def test_no_token_travels_through_a_carrier(tmp_path: Path) -> None:
    wire = tmp_path / "wire"
    far_side = tmp_path / "far-side"  # keeps a copy of every byte the far side reads
    far_side.write_text(f'#!/bin/sh\ntee {wire} | {REMOTE} "$@"\n')
    far_side.chmod(0o700)
    result = await run(["echo", "ran"], address="via:env", token="sekrit-token-1234",
                       remote_command=str(far_side))
    assert (result.returncode, result.stdout) == (0, b"ran\n")
    assert b"hello" in wire.read_bytes()  # the copy is of the protocol
    assert b"sekrit" not in wire.read_bytes()
