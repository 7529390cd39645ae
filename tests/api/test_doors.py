"""Section 13: the same session from every door. A session started over HTTP is listed,
attached and journaled (peer http:ADDR) like any other, one started by the library is
followed over HTTP, and one nobody comes back for is hung up by its detached timeout."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers import SH
from http_api import ApiServer, api_server, create, events, output_of, request

from ttyserve.client import connect
from ttyserve.server.journal import SessionEnd, SessionStart, read_file

pytestmark = [pytest.mark.timeout(60), pytest.mark.asyncio]


def framed(api: ApiServer) -> str:
    """The framed protocol's address on the same listener (the WebSocket carriage)."""
    return api.url.replace("http://", "ws:").removesuffix("/api/v1")


async def test_a_session_started_over_http_is_every_doors(short_dir: Path, workers: int,
                                                          ) -> None:
    journal = short_dir / "j.jsonl"
    api = api_server(short_dir, "--journal", str(journal))
    try:
        session = create(api, argv=[SH, "-c", "echo from-http; read line; echo got-$line"],
                         pty=False)
        async with connect(framed(api), token=api.token, multiplex=True) as conn:
            (info,) = await conn.list_sessions()
            assert info.session == session and info.attached is False
            attached = await conn.attach(session)
            await attached.send(b"library\n")
            output = b"".join([chunk.data async for chunk in attached])
            assert output == b"from-http\ngot-library\n"
            assert attached.status is not None and attached.status.code == 0
        # The library's writer read the exit and released it (section 10): gone for all,
        # once the release it sends after reading has reached the server.
        deadline = time.monotonic() + 20
        while (gone := request(api, "GET", f"/sessions/{session}")).status != 404:
            assert time.monotonic() < deadline, gone.body
            time.sleep(0.02)
        assert gone.json()["error"]["code"] == "no_such_session"
    finally:
        api.server.stop()
    records = [r for r in read_file(str(journal)).records if getattr(r, "id", None) == session]
    (start,) = [r for r in records if isinstance(r, SessionStart)]
    assert start.peer == "http:127.0.0.1"
    assert [r.reason for r in records if isinstance(r, SessionEnd)] == ["exit"]


async def test_a_session_of_the_library_is_followed_over_http(api: ApiServer) -> None:
    async with connect(framed(api), token=api.token, multiplex=True) as conn:
        session = await conn.spawn([SH, "-c", "echo out; echo err >&2; exit 9"], pty=False,
                                   detachable=True)
        await session.detach()
        assert session.id is not None
    stream = events(api, session.id)
    assert stream[0] == {"type": "attached", "offsets": {"stdout": 0, "stderr": 0}}
    assert (output_of(stream), output_of(stream, "stderr")) == (b"out\n", b"err\n")
    assert stream[-1] == {"type": "exit", "code": 9}
    offsets = [e["offset"] for e in stream if e["type"] == "output"]
    assert offsets == [0, 0]


async def test_a_session_nobody_comes_back_for_is_hung_up(api: ApiServer) -> None:
    session = create(api, argv=["sleep", "30"], pty=False, detached_timeout=1)
    ended = request(api, "GET", f"/sessions/{session}?wait=20")
    assert ended.status == 200 and ended.json()["exit"]["signal"] == "HUP"
    # Hung up past its timeout, its exit is not kept for anyone.
    assert request(api, "GET", f"/sessions/{session}").status == 404
