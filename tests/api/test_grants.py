"""Section 13 with a grant (section 11): `Bearer GRANT` reaches the one session, an observer
grant only reads, and during an upgrade a waiting request hears 503 with Retry-After."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from helpers import SH
from http_api import Answer, ApiServer, create, events, output_of, request

from ttyserve.client import connect

pytestmark = [pytest.mark.timeout(60)]


def framed(api: ApiServer) -> str:
    return api.url.replace("http://", "ws:").removesuffix("/api/v1")


@pytest.mark.asyncio
async def test_an_observer_grant_reads_and_cannot_write(api: ApiServer) -> None:
    session = create(api, argv=[SH, "-c", "echo shared; read line; echo got-$line"],
                     pty=False)
    async with connect(framed(api), token=api.token, multiplex=True) as conn:
        shared = await conn.share(session)
    as_grant = ApiServer(api.server, api.url, shared.grant)
    refused = request(as_grant, "POST", f"/sessions/{session}/stdin", b"x\n")
    assert (refused.status, refused.json()["error"]["code"]) == (403, "forbidden")
    listing = request(as_grant, "GET", "/sessions")
    assert (listing.status, listing.json()["error"]["code"]) == (403, "forbidden")
    other = create(api, argv=["true"], pty=False)
    elsewhere = request(as_grant, "GET", f"/sessions/{other}/output")
    assert elsewhere.status == 403
    assert request(api, "POST", f"/sessions/{session}/stdin", b"owner\n").status == 204
    stream = events(as_grant, session)
    assert output_of(stream) == b"shared\ngot-owner\n" and stream[-1]["type"] == "exit"


def test_a_wait_during_an_upgrade_hears_503_with_retry_after(api: ApiServer) -> None:
    session = create(api, argv=["sleep", "30"], pty=False)
    answers: list[Answer] = []
    waiting = threading.Thread(target=lambda: answers.append(
        request(api, "GET", f"/sessions/{session}?wait=30")))
    waiting.start()
    while request(api, "GET", f"/sessions/{session}").json()["observers"] == 0:
        time.sleep(0.01)  # until the wait watches (an observer of the session)
    api.server.proc.send_signal(signal.SIGUSR2)
    waiting.join(timeout=30)
    (answer,) = answers
    error = answer.json()["error"]
    assert (answer.status, error["code"]) == (503, "server_restarting"), error
    assert answer.json()["error"]["retriable"] is True
    assert int(answer.headers["retry-after"]) >= 1
