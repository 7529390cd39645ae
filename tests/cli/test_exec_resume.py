"""`exec --resume` through a real fault injector: every line once through 30 cuts and black
holes, the exit once when the cut falls between the server's `exit` and the client's read,
the contract's lines and `--json` events, and exit 255 once it gives up."""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from faults import FaultProxy, fault_proxy
from helpers import ServerProcess, start_server, ttyserve_command
from helpers import token_file as write_token

from ttyserve.client import connect

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(180), pytest.mark.usefixtures("workers")]
TOKEN = "exec-resume-token"
LINES = 6_000_000  # `seq 1 LINES`: 52.9 MB of numbered lines
SEQ_BYTES = sum(len(str(n)) + 1 for n in range(1, LINES + 1))


@pytest.fixture
def token_file(short_dir: Path) -> Path:
    return write_token(short_dir, TOKEN)


@pytest.fixture
def server(short_dir: Path, token_file: Path) -> Iterator[ServerProcess]:
    process = start_server(short_dir, "--token-file", str(token_file),
                           "--scrollback", str(64 << 20), listen=["tcp:127.0.0.1:0"])
    try:
        yield process
    finally:
        process.stop()


async def run_exec(proxy: FaultProxy, token_file: Path, *args: str, during: object = None,
                   command: str = "exec", args_last: list[str] | None = None,
                   ) -> tuple[int, bytes, str]:
    """`exec` (or ``command``) through the proxy; its exit code, stdout and stderr.
    ``during`` (a coroutine function taking the process) runs beside it."""
    argv = ttyserve_command(command, "--connect", proxy.address, "--token-file",
                            str(token_file), *args, *(args_last or []))
    process = await anyio.open_process(argv, stdin=subprocess.DEVNULL)
    out: list[bytes] = []
    err: list[bytes] = []

    async def drain(stream: anyio.abc.ByteReceiveStream, into: list[bytes]) -> None:
        async for data in stream:
            into.append(data)

    async with process, anyio.create_task_group() as tg:
        assert process.stdout is not None and process.stderr is not None
        tg.start_soon(drain, process.stdout, out)
        tg.start_soon(drain, process.stderr, err)
        if during is not None:
            tg.start_soon(during, process)  # type: ignore[arg-type]
        code = await process.wait()
    return code, b"".join(out), b"".join(err).decode(errors="replace")


async def test_every_line_once_through_30_cuts_and_black_holes(
        server: ServerProcess, token_file: Path) -> None:
    rng = random.Random(17)
    points = sorted(rng.sample(range(500_000, SEQ_BYTES - 2_000_000), 30))
    faults = ["black hole" if i % 5 == 3 else "cut" for i in range(30)]
    async with fault_proxy(server.addresses[0]) as proxy:

        async def inject(process: object) -> None:
            for point, fault in zip(points, faults, strict=True):
                await proxy.fault_at(point, fault)

        code, out, err = await run_exec(proxy, token_file, "--resume", "60", "--heartbeat", "1",
                                        "-T", "--", "seq", "1", str(LINES), during=inject)
    assert code == 0, err[-2000:]
    assert len(out) == SEQ_BYTES, (len(out), err[-3000:])
    assert out == b"".join(b"%d\n" % n for n in range(1, LINES + 1))
    assert proxy.faults == faults
    target = re.escape(proxy.address)
    assert len(re.findall(rf"ttyserve: {target}: connection lost \(.+\); resuming\n", err)) == 30
    resumed = re.findall(rf"ttyserve: {target}: resumed after (\d+\.\d) s\n", err)
    assert len(resumed) == 30 and "bytes lost" not in err, err


async def test_a_cut_between_the_exit_sent_and_read_still_gives_the_exit_once(
        server: ServerProcess, token_file: Path) -> None:
    async with fault_proxy(server.addresses[0]) as proxy:
        proxy.cut_before = "exit"  # the server's `exit` never reaches this client
        code, out, err = await run_exec(proxy, token_file, "--resume", "30", "--json", "-T",
                                        "--", "sh", "-c", "echo partial; exit 3")
    assert proxy.faults == ["cut"] and proxy.connections == 2
    events = [json.loads(line) for line in out.splitlines()]
    names = [event["event"] for event in events]
    assert names == ["opened", "stdout", "lost", "resumed", "exit"], (names, err)
    assert events[-1] == {"event": "exit", "code": 3} and code == 3
    assert events[3] == {"event": "resumed", "lost_bytes": 0}


async def test_once_it_cannot_come_back_it_says_lost_and_exits_255(
        server: ServerProcess, token_file: Path) -> None:
    async with fault_proxy(server.addresses[0]) as proxy:
        proxy.cut_after = b"marker-line"
        proxy.max_connections = 1  # every redial is closed at once
        code, out, err = await run_exec(proxy, token_file, "--resume", "2", "-T", "--", "sh",
                                        "-c", "echo marker-line; sleep 60")
    assert code == 255 and out in (b"", b"marker-line\n")  # (a reset may drop what it cut)
    assert re.search(rf"ttyserve: {re.escape(proxy.address)}: lost: could not resume "
                     r"within 2 s", err), err
    # The server hangs the session up too, 2 s after it lost its client.
    async with connect(server.addresses[0], token=TOKEN, multiplex=True) as conn:
        with anyio.fail_after(10):
            while await conn.list_sessions():
                await anyio.sleep(0.1)



async def test_attach_resume_comes_back_too(server: ServerProcess, token_file: Path) -> None:
    async with connect(server.addresses[0], token=TOKEN, multiplex=True) as conn:
        session = await conn.spawn(["sh", "-c", "echo first; read x; seq 1 20000; exit 5"],
                                   pty=False, detachable=True)
        assert (await session.receive()) is not None  # `first`: it runs
        await session.detach()
    assert session.id is not None
    async with fault_proxy(server.addresses[0]) as proxy:
        proxy.cut_before = "eof"  # the end of input is lost with the link: said again after
        code, out, err = await run_exec(proxy, token_file, "--resume", "30", "--heartbeat",
                                        "1", command="attach", args_last=[session.id])
    assert proxy.faults == ["cut"] and "resumed after" in err, err
    assert out == b"first\n" + b"".join(b"%d\n" % n for n in range(1, 20001))
    assert code == 5


async def test_a_local_sigint_still_reaches_the_remote_process(
        server: ServerProcess, token_file: Path) -> None:
    """Only a lost connection detaches: Ctrl-C is the remote process's, as without
    --resume."""
    process = await anyio.open_process(ttyserve_command(
        "exec", "--connect", server.addresses[0], "--token-file", str(token_file), "--resume",
        "30", "-T", "--", "sh", "-c",
        "trap 'echo got-int; exit 3' INT; echo ready; while :; do sleep 0.05; done"),
        stdin=subprocess.DEVNULL)
    async with process:
        assert process.stdout is not None
        seen = b""
        with anyio.fail_after(20):
            while b"ready\n" not in seen:
                seen += await process.stdout.receive()
            process.send_signal(signal.SIGINT)
            async for data in process.stdout:
                seen += data
            code = await process.wait()
    assert seen == b"ready\ngot-int\n" and code == 3


async def test_a_session_gone_when_it_comes_back_is_lost_with_255(
        short_dir: Path, token_file: Path) -> None:
    """With --keep-ended 0 the server forgets a session once it sent its exit; the proxy
    drops that exit and cuts: the attach that comes back is refused, and exec says so."""
    server = start_server(short_dir, "--token-file", str(token_file), "--keep-ended", "0",
                          listen=["tcp:127.0.0.1:0"])
    try:
        async with fault_proxy(server.addresses[0]) as proxy:
            proxy.cut_before = "exit"
            code, out, err = await run_exec(proxy, token_file, "--resume", "30", "-T", "--",
                                            "sh", "-c", "echo done-here; exit 4")
    finally:
        server.stop()
    assert code == 255 and out == b"done-here\n", err
    assert re.search(r"lost: could not resume: the server answered no_such_session", err), err


async def test_a_second_sigint_ends_exec_during_an_outage(
        server: ServerProcess, token_file: Path) -> None:
    """Signals do not wait for the resume: the second SIGINT cancels at once (130), as
    without --resume, though the server cannot be reached to hear it."""
    async with fault_proxy(server.addresses[0]) as proxy:
        proxy.cut_after = b"marker-line"
        process = await anyio.open_process(ttyserve_command(
            "exec", "--connect", proxy.address, "--token-file", str(token_file), "--resume",
            "60", "-T", "--", "sh", "-c", "echo marker-line; sleep 60"),
            stdin=subprocess.DEVNULL)
        async with process:
            assert process.stderr is not None
            said = b""
            with anyio.fail_after(20):
                await proxy.wait_fault()
                proxy.refuse()  # no way back: every redial is refused, and backs off
                while b"resuming" not in said:
                    said += await process.stderr.receive()
                started = anyio.current_time()
                process.send_signal(signal.SIGINT)
                while signal_pending(process.pid, signal.SIGINT):  # (two at once are one)
                    await anyio.sleep(0.01)
                process.send_signal(signal.SIGINT)
                code = await process.wait()
            assert code == 130 and anyio.current_time() - started < 5


def signal_pending(pid: int, signum: int) -> bool:
    """Whether ``signum`` waits to be delivered to ``pid`` (the kernel keeps one of each)."""
    with open(f"/proc/{pid}/status") as status:
        fields = dict(line.split(":", 1) for line in status)
    mask = int(fields["ShdPnd"], 16) | int(fields["SigPnd"], 16)
    return bool(mask & (1 << (signum - 1)))
