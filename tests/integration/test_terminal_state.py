"""The terminal's state (protocol section 14): a channel that asks gets `modes` once before
any output and at every change, before the output read with the change, with the offset it
holds from; the verdict is the flags' (echoed, application, hidden), never the echo alone;
over the framed protocol, the WebSocket and the HTTP API, across a hop between workers,
through attach with offsets and as an observer; and a recording never holds input read
unseen."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import ServerProcess, start_server, token_file, worker_of

from ttyserve.client import connect
from ttyserve.protocol.messages import Modes

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]
BASH = shutil.which("bash") or "/bin/bash"
TOKEN = "terminal-state-token"
# ECHO off, a prompt, a line read unseen, ECHO back on: sudo -S, ssh's passphrase prompt.
SUDO_LIKE = "stty -echo; printf 'Password: '; read x; stty echo; echo; echo got:$x"


@pytest.fixture
def server(short_dir: Path) -> Iterator[ServerProcess]:
    casts = short_dir / "casts"
    server = start_server(short_dir, "--token-file", str(token_file(short_dir, TOKEN)),
                          "--record", str(casts), "--record-input", "--linger", "1",
                          listen=[f"unix:{short_dir / 's.sock'}", "ws:127.0.0.1:0"])
    try:
        yield server
    finally:
        server.stop()


Event = bytes | Modes


async def events_until(session: Any, marker: bytes | None = None) -> list[Event]:
    """The session's output and `modes`, in order, until ``marker`` was printed (or the
    exit); neighbouring output joined."""
    found: list[Event] = []
    seen = b""
    with anyio.fail_after(20):
        while (event := await session.next_event()) is not None:
            if isinstance(event, Modes):
                found.append(event)
                continue
            seen += event.data
            if found and isinstance(found[-1], bytes):
                found[-1] += event.data
            else:
                found.append(event.data)
            if marker is not None and marker in seen:
                break
    return found


def verdicts(found: list[Event]) -> list[str]:
    return [event.input for event in found if isinstance(event, Modes)]


@pytest.mark.asyncio
async def test_a_hidden_prompt_is_told_before_it_and_the_echo_back_after(
        server: ServerProcess) -> None:
    async with connect(server.addresses[0], token=TOKEN, multiplex=True) as conn:
        session = await conn.spawn(["sh", "-c", SUDO_LIKE], modes=True)
        found = await events_until(session, b"Password: ")
        first = found[0]  # (echoed, or hidden: stty may have run before the server's first look)
        assert isinstance(first, Modes) and first.offset == 0
        hidden = next(e for e in found if isinstance(e, Modes) and e.input == "hidden")
        assert (hidden.echo, hidden.canonical) == (False, True)
        prompt = found.index(hidden) + 1  # the prompt comes after the `hidden`, never before
        assert b"Password: " in b"".join(e for e in found[prompt:] if isinstance(e, bytes))
        assert b"Password" not in b"".join(e for e in found[:prompt] if isinstance(e, bytes))
        assert hidden.offset == sum(len(e) for e in found[:prompt] if isinstance(e, bytes))
        await session.send(b"hunter2\r")
        after = await events_until(session)
        assert verdicts(after) == ["echoed"] and b"got:hunter2" in b"".join(
            e for e in after if isinstance(e, bytes))
        assert b"hunter2\r\n" not in b"".join(e for e in after if isinstance(e, bytes))[:12]


@pytest.mark.asyncio
async def test_readline_is_application_and_getpass_hidden(server: ServerProcess) -> None:
    script = ("read -e -p 'name? ' n; python3 -c 'import getpass; getpass.getpass(\"pw: \")'; "
              "echo done")
    async with connect(server.addresses[0], token=TOKEN, multiplex=True) as conn:
        session = await conn.spawn([BASH, "--norc", "-c", script], modes=True)
        found = await events_until(session, b"name? ")
        assert verdicts(found)[-1] == "application"  # readline: both flags off
        last = [e for e in found if isinstance(e, Modes)][-1]
        assert (last.echo, last.canonical) == (False, False)
        await session.send(b"ann\r")
        found = await events_until(session, b"pw: ")
        assert verdicts(found)[-1] == "hidden"
        await session.send(b"secret\r")
        rest = await events_until(session)
        assert b"done" in b"".join(e for e in rest if isinstance(e, bytes))


@pytest.mark.asyncio
async def test_the_alternate_screen_and_cat_and_no_modes_unasked(server: ServerProcess) -> None:
    script = r"printf 'a\033[?1049hb'; read x; printf 'c\033[?1049ld'; read y"
    async with connect(server.addresses[0], token=TOKEN, multiplex=True) as conn:
        session = await conn.spawn(["sh", "-c", script], modes=True)
        found = await events_until(session, b"b")
        switched = [e for e in found if isinstance(e, Modes) and e.alt_screen]
        assert switched and switched[0].offset == 0  # seen in the piece that holds it
        assert found.index(switched[0]) < next(
            i for i, e in enumerate(found) if isinstance(e, bytes) and b"\x1b[?1049h" in e)
        await session.send(b"\r")
        found = await events_until(session, b"d")
        back = [e for e in found if isinstance(e, Modes)]
        assert back and not back[-1].alt_screen
        await session.send(b"\r")
        await events_until(session)
        plain = await conn.spawn(["sh", "-c", "echo hi; stty -echo; echo there"])
        assert all(isinstance(e, bytes) for e in await events_until(plain))  # not asked
        piped = await conn.spawn(["echo", "pipe"], pty=False, modes=True)
        assert await events_until(piped) == [b"pipe\n"]  # pipes have no terminal


@pytest.mark.asyncio
async def test_a_change_with_no_output_after_it_is_told_at_the_next_input(
        server: ServerProcess, short_dir: Path) -> None:
    # The program prints, waits until the test has read that, turns ECHO off and says so in
    # a file (not on the terminal): no output comes after the change.
    gate, flag = short_dir / "gate", short_dir / "echo-off"
    script = (f"echo up; until [ -e {gate} ]; do sleep 0.01; done; stty -echo; touch {flag}; "
              "read x; echo got:$x")
    async with connect(server.addresses[0], token=TOKEN, multiplex=True) as conn:
        session = await conn.spawn(["sh", "-c", script], modes=True)
        assert verdicts(await events_until(session, b"up")) == ["echoed"]
        gate.touch()
        with anyio.fail_after(20):
            while not flag.exists():
                await anyio.sleep(0.02)  # (a file tells nobody it appeared)
        await session.send(b"x\r")
        after = await events_until(session)
        first = after[0]
        assert isinstance(first, Modes) and first.input == "hidden", after
        assert first.offset == len(b"up\r\n")
        assert b"".join(e for e in after if isinstance(e, bytes)).startswith(b"got:x")


@pytest.mark.asyncio
async def test_attach_and_observe_get_the_state_now_across_workers_and_websockets(
        server: ServerProcess, workers: int) -> None:
    for address in server.addresses:  # Unix (a uid's sessions), WebSocket (the token's)
        async with connect(address, token=TOKEN, multiplex=True) as conn:
            session = await conn.spawn(["sh", "-c", "stty -echo; echo ready; read x; echo $x"],
                                       modes=True, detachable=True)
            await events_until(session, b"ready")
            home = await worker_of(conn)
            await session.detach()
        async with contextlib.AsyncExitStack() as stack:
            other = await stack.enter_async_context(connect(address, token=TOKEN,
                                                            multiplex=True))
            for _ in range(20):  # (with two workers: one that is not the session's)
                if workers == 1 or await worker_of(other) != home:
                    break
                other = await stack.enter_async_context(connect(address, token=TOKEN,
                                                                multiplex=True))
            assert workers == 1 or await worker_of(other) != home  # across the hop
            watcher = await other.attach(str(session.id), role="observer", modes=True)
            writer = await other.attach(str(session.id), modes=True, offsets=session.offsets)
            for attached in (watcher, writer):
                first = await attached.next_event()
                assert isinstance(first, Modes) and first.input == "hidden"
                assert first.offset == len(b"ready\r\n")  # the stream's end
            await writer.send(b"bye\r")
            assert b"bye" in b"".join([c.data async for c in writer])


@pytest.mark.asyncio
async def test_the_http_output_stream_carries_modes_when_asked(server: ServerProcess) -> None:
    import http.client

    host, port = server.addresses[1].split(":", 1)[1].rsplit(":", 1)
    async with connect(server.addresses[1], token=TOKEN, multiplex=True) as conn:  # (the
        # token's sessions: the HTTP API's principal)
        session = await conn.spawn(["sh", "-c", SUDO_LIKE], modes=True, detachable=True)
        await events_until(session, b"Password: ")
        await session.detach()

        def stream(query: str) -> list[dict[str, Any]]:
            client = http.client.HTTPConnection(host, int(port), timeout=30)
            client.request("GET", f"/api/v1/sessions/{session.id}/output{query}",
                           headers={"Authorization": f"Bearer {TOKEN}"})
            answer = client.getresponse()
            assert answer.status == 200
            lines: list[dict[str, Any]] = []
            while not lines or lines[-1]["type"] != "output":  # attached, (modes,) output
                lines.append(json.loads(answer.readline()))
            client.close()
            return lines

        asked = await anyio.to_thread.run_sync(stream, "?modes=true")
        assert asked[0]["type"] == "attached"
        assert asked[1]["type"] == "modes" and asked[1]["input"] == "hidden"
        assert asked[1]["offset"] == session.offsets.stdout
        unasked = await anyio.to_thread.run_sync(stream, "")
        assert "modes" not in [line["type"] for line in unasked]
        writer = await conn.attach(str(session.id), steal=True)  # (a stream may not have
        await writer.send(b"x\r")  # let go yet)
        await writer.wait()


@pytest.mark.asyncio
async def test_a_recording_never_holds_input_read_unseen(
        server: ServerProcess, short_dir: Path) -> None:
    async with connect(server.addresses[0], token=TOKEN, multiplex=True) as conn:
        session = await conn.spawn(["sh", "-c", SUDO_LIKE + "; read y; echo seen:$y"])
        await events_until(session, b"Password: ")
        await session.send(b"hunter2\r")
        await events_until(session, b"got:")
        await session.send(b"visible\r")
        assert (await session.wait()).code == 0
    path = short_dir / "casts" / f"{session.id}.cast" if session.id else None
    casts = list((short_dir / "casts").glob("*.cast"))
    with anyio.fail_after(20):
        while not casts or '"x"' not in casts[0].read_text():
            await anyio.sleep(0.05)  # (a file tells nobody it grew)
            casts = list((short_dir / "casts").glob("*.cast"))
    assert path is None or casts == [path]
    events = [json.loads(line) for line in casts[0].read_text().splitlines()[1:]]
    typed = "".join(e[2] for e in events if e[1] == "i")
    assert "hunter2" not in typed and "visible" in typed  # (its output says it: got:...)
    assert [e[2] for e in events if e[1] == "m"] == ["input hidden"]


# Each program, and what its prompt's verdict is: told before the prompt itself.
PROGRAMS = {
    "cat": (["sh", "-c", "printf 'cat> '; exec cat"], b"cat> ", "echoed", False),
    "readline": ([BASH, "--norc", "-c", "read -e -p 'rl> ' x"], b"rl> ", "application", False),
    "getpass": (["python3", "-c", "import getpass; getpass.getpass('gp> ')"], b"gp> ",
                "hidden", False),
    "read -s": ([BASH, "--norc", "-c", "read -s -p 'rs> ' x"], b"rs> ", "hidden", False),
    "sudo -S": (["sh", "-c", "stty -echo; printf 'su> '; read x"], b"su> ", "hidden", False),
    "alt screen": (["sh", "-c", r"printf '\033[?1049hal> '; read x"], b"al> ", "echoed", True),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("transport", ["unix", "ws"])
@pytest.mark.parametrize("program", list(PROGRAMS))
async def test_each_program_s_verdict_comes_before_its_prompt(
        server: ServerProcess, program: str, transport: str) -> None:
    argv, prompt, verdict, alt_screen = PROGRAMS[program]
    address = server.addresses[0 if transport == "unix" else 1]
    async with connect(address, token=TOKEN, multiplex=True) as conn:
        session = await conn.spawn(argv, modes=True)
        found = await events_until(session, prompt)
        told = [e for e in found if isinstance(e, Modes)]
        at = next(i for i, e in enumerate(found) if isinstance(e, bytes) and prompt in b"".join(
            x for x in found[:i + 1] if isinstance(x, bytes)))
        before = [e for e in found[:at] if isinstance(e, Modes)]
        assert before and (before[-1].input, before[-1].alt_screen) == (verdict, alt_screen), (
            program, told)
        await session.cancel()
