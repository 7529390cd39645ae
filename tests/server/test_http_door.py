"""The HTTP API's routes in process (issue 38): requests to worker 0's front door for a
session of worker 1, so each goes through the API, its in-process connection and the hop,
with no subprocess. The stream's output is read in process and paced by its grants; a
write goes in beside the stream (role `input`), never in its place; the API's own roles
are refused to other clients; DELETE answers once the session has ended."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import anyio
import h11
import pytest
from helpers import ctrl
from server.test_hop import control, detached_session, hello
from server.workers import Worker, two_workers

from ttyserve.errors import ErrorCode
from ttyserve.protocol.messages import INPUT, STREAM, Attach
from ttyserve.transport.streams import SocketByteStream

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
SIZE = 3_000_000  # three windows of credit: a stream that never gives its credit back stalls


class Client:
    """Requests one after another on one kept-alive HTTP connection (h11)."""

    def __init__(self, stream: SocketByteStream) -> None:
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT)

    async def send(self, method: str, path: str, body: bytes = b"") -> None:
        if self.conn.our_state is h11.DONE:
            self.conn.start_next_cycle()
        head = h11.Request(method=method, target=f"/api/v1/{path}", headers=[
            ("Host", "127.0.0.1:7681"), ("Content-Length", str(len(body)))])
        await self.stream.send(b"".join(self.conn.send(event) or b"" for event in (
            head, h11.Data(data=body), h11.EndOfMessage())))

    async def events(self) -> Any:
        """The answer's status, then its body's pieces as they come."""
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self.stream.receive())
            elif isinstance(event, h11.Response):
                yield event.status_code
            elif isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        await self.send(method, path, body)
        status, *pieces = [piece async for piece in self.events()]
        return status, b"".join(pieces)


async def create(worker: Worker, script: str) -> str:
    """A session made on ``worker`` through its API (one principal with the requests)."""
    async with worker.http() as door:
        status, body = await Client(door).request("POST", "sessions", json.dumps(
            {"argv": ["sh", "-c", script], "pty": False}).encode())
    assert status == 201, body
    return str(json.loads(body)["session"])


async def test_a_stream_across_workers_has_every_byte_while_writes_go_in_beside_it(
        tmp_path: Path) -> None:
    async with two_workers(tmp_path) as (here, there):
        session = await create(there, f"read go; head -c {SIZE} /dev/zero; exit 7")
        async with here.http() as first, here.http() as second:
            stream, writer = Client(first), Client(second)
            await stream.send("GET", f"sessions/{session}/output")
            answer = stream.events()
            assert await anext(answer) == 200
            lines = b""
            while b"\n" not in lines:
                lines += await anext(answer)
            assert json.loads(lines.split(b"\n")[0])["type"] == "attached"
            status, listing = await writer.request("GET", "sessions")  # (from both workers)
            assert status == 200, listing
            (entry,) = [e for e in json.loads(listing)["sessions"] if e["session"] == session]
            assert entry.get("attached_by") == "http"  # the writer known by its role: stream
            # a write while the stream holds the session: beside it, never in its place
            assert await writer.request("POST", f"sessions/{session}/stdin", b"go\n") == (
                204, b"")
            with anyio.fail_after(30):
                async for piece in answer:
                    lines += piece
    events = [json.loads(line) for line in lines.splitlines()]
    output = [e for e in events if e["type"] == "output"]
    assert sum(len(base64.b64decode(e["data"])) for e in output) == SIZE
    offsets = [e["offset"] for e in output]
    assert offsets[0] == 0 and offsets == sorted(offsets)  # in order, none twice
    assert events[-1] == {"type": "exit", "code": 7}
    assert all(e["type"] in ("attached", "output") for e in events[:-1])


async def test_delete_answers_once_the_session_has_ended(tmp_path: Path) -> None:
    async with two_workers(tmp_path) as (here, there):
        session = await create(there, "trap '' HUP; printf up; while :; do sleep 1; done")
        async with here.http() as door:
            client = Client(door)
            status, _ = await client.request("GET", f"sessions/{session}")
            assert status == 200
            with anyio.fail_after(20):
                assert (await client.request("DELETE", f"sessions/{session}"))[0] == 204
            assert session not in there.registry.sessions  # its tree killed and reaped
            status, body = await client.request("GET", f"sessions/{session}")
            assert status == 404, body


@pytest.mark.parametrize("role", [STREAM, INPUT])
async def test_the_http_api_roles_are_refused_to_other_clients(tmp_path: Path,
                                                                 role: str) -> None:
    async with two_workers(tmp_path) as (here, there):
        session = await detached_session(there, "sleep 30")
        for worker in (here, there):  # (here: asked over the hop)
            async with worker.client() as peer:
                await peer.send(hello() + ctrl(1, Attach(session=session, role=role)))
                assert (await control(peer))["type"] == "welcome"
                refused = await control(peer, 1)
                assert refused["code"] == ErrorCode.BAD_REQUEST, refused
                assert "HTTP API's own" in str(refused["message"])


async def test_writes_keep_a_session_from_its_detached_timeout_as_a_writer_did(
        tmp_path: Path) -> None:
    """An HTTP write (`input`) counts as an attach for the detached timeout: a coordinator
    that only writes, each write sooner than the timeout after the last, keeps its session
    (as when a write attached as the writer); the timeout runs out only after the last."""
    async with two_workers(tmp_path, detached_timeout=1.5) as (here, there):
        session = await create(there, "cat")
        async with here.http() as door:
            client = Client(door)
            for _ in range(4):  # 0.8 s apart: 2.4 s in all, past the 1.5 s timeout
                assert (await client.request(
                    "POST", f"sessions/{session}/stdin", b"x\n"))[0] == 204
                await anyio.sleep(0.8)  # (time passing is what is tested)
            status, body = await client.request("GET", f"sessions/{session}")
            assert status == 200 and json.loads(body)["exit"] is None, body
