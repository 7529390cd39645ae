"""Section 13's errors: each status with its code, a message that names what was wrong, and
the server serving on; wait, and in_use."""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path

import anyio
import pytest
from helpers import SH
from http_api import (
    ApiServer,
    api_server,
    create,
    events,
    open_stream,
    output_of,
    request,
)

from ttyserve.client import connect
from ttyserve.defaults import HTTP_MAX_JSON_BODY
from ttyserve.errors import SessionDetached

pytestmark = [pytest.mark.timeout(60)]


def error_of(answer: object) -> tuple[int, str]:
    status, body = answer.status, answer.json()  # type: ignore[attr-defined]
    assert set(body["error"]) >= {"code", "message", "retriable"}, body
    assert body["error"]["message"]
    return status, body["error"]["code"]


def test_the_token_is_asked_for(api: ApiServer) -> None:
    assert error_of(request(api, "GET", "/sessions", auth=False)) == (401, "unauthorized")
    wrong = request(api, "GET", "/sessions", auth=False,
                    headers={"Authorization": "Bearer not-the-token"})
    assert error_of(wrong) == (401, "unauthorized")
    basic = request(api, "GET", "/sessions", auth=False, headers={"Authorization": "Basic eA=="})
    assert error_of(basic) == (401, "unauthorized")
    assert request(api, "GET", "/sessions").json() == {"sessions": []}


def test_bad_requests_are_named(api: ApiServer) -> None:
    cases = [("POST", "/sessions", b"{not json", 400, "bad_request"),
             ("POST", "/sessions", b'{"argv": "ls"}', 400, "bad_request"),
             ("POST", "/sessions", b'{"argv": ["ls"], "colour": 1}', 400, "bad_request"),
             ("GET", "/nothing", None, 404, "bad_request"),
             ("PUT", "/sessions", b"{}", 405, "bad_request"),
             ("GET", "/sessions/s0.nobody-has-this-one", None, 404, "no_such_session"),
             ("GET", "/sessions/nobody/output", None, 404, "no_such_session"),
             ("GET", "/sessions/x/output?stdout=minus", None, 400, "bad_request"),
             ("GET", "/sessions/x?wait=301", None, 400, "bad_request"),
             ("GET", "/sessions/x/output?stdout=%C2%B2", None, 400, "bad_request")]
    for method, path, body, status, code in cases:
        assert error_of(request(api, method, path, body)) == (status, code), (method, path)
    assert request(api, "PUT", "/sessions", b"{}").headers["allow"] == "GET, POST"


def test_a_body_over_its_limit_gets_413_and_the_server_goes_on(api: ApiServer) -> None:
    big = json.dumps({"argv": ["true"], "env": {"X": "x" * HTTP_MAX_JSON_BODY}}).encode()
    assert error_of(request(api, "POST", "/sessions", big)) == (413, "bad_request")
    assert request(api, "GET", "/sessions").status == 200


def test_a_command_that_cannot_start_gets_422_with_errno(api: ApiServer) -> None:
    answer = request(api, "POST", "/sessions", b'{"argv": ["/no/such/program"]}')
    assert error_of(answer) == (422, "spawn_failed")
    assert answer.json()["error"]["errno"] == 2


def test_a_page_of_another_origin_is_refused(api: ApiServer) -> None:
    answer = request(api, "GET", "/sessions", headers={"Origin": "http://evil.example"})
    assert error_of(answer) == (403, "forbidden")
    assert "evil.example" in answer.json()["error"]["message"]


def test_max_sessions_is_429(short_dir: Path, workers: int) -> None:
    served = api_server(short_dir, "--max-sessions", "1")
    try:
        create(served, argv=["sleep", "30"], pty=False)
        answer = request(served, "POST", "/sessions", b'{"argv": ["true"]}')
        assert error_of(answer) == (429, "busy")
        assert answer.json()["error"]["retriable"] is True
    finally:
        served.server.stop()


def test_wait_answers_when_the_session_ends(api: ApiServer) -> None:
    session = create(api, argv=[SH, "-c", "read line; exit 4"], pty=False)
    started = time.monotonic()
    quick = request(api, "GET", f"/sessions/{session}?wait=0.5").json()
    assert quick["exit"] is None and time.monotonic() - started >= 0.5
    assert request(api, "POST", f"/sessions/{session}/stdin", b"go\n").status == 204
    ended = request(api, "GET", f"/sessions/{session}?wait=30").json()
    assert ended["exit"] == {"code": 4} and ended["offsets"] == {"stdout": 0, "stderr": 0}
    assert ended["argv"] == [SH, "-c", "read line; exit 4"] and ended["attached"] is False


@pytest.mark.asyncio
async def test_stdin_is_in_use_while_a_framed_writer_is_attached(api: ApiServer) -> None:
    session = create(api, argv=["cat"], pty=False)
    address = api.url.replace("http://", "ws:").removesuffix("/api/v1")
    async with connect(address, token=api.token, multiplex=True) as conn:
        attached = await conn.attach(session)
        answer = await anyio.to_thread.run_sync(
            lambda: request(api, "POST", f"/sessions/{session}/stdin", b"x"))
        assert error_of(answer) == (409, "session_in_use")
        await attached.detach()
    while request(api, "GET", f"/sessions/{session}").json()["attached"]:
        await anyio.sleep(0.02)  # (a detach is a send: until the server has it)
    assert request(api, "POST", f"/sessions/{session}/stdin", b"after\n").status == 204
    assert request(api, "POST", f"/sessions/{session}/eof").status == 204
    stream = events(api, session)
    assert stream[-1] == {"type": "exit", "code": 0}
    assert output_of(stream) == b"after\n"


def test_stdin_goes_in_while_an_http_stream_holds_the_session(api: ApiServer) -> None:
    """An HTTP output stream does not make stdin in_use (section 13), whichever worker the
    stdin request reaches (with workers: the stream gives its role up for the moment)."""
    session = create(api, argv=["cat"], pty=False)
    stream, answer = open_stream(api, session)
    try:
        assert json.loads(answer.readline())["type"] == "attached"
        while not request(api, "GET", f"/sessions/{session}").json()["attached"]:
            time.sleep(0.01)  # (the stream is the session's writer)
        sent = [b"line-%d\n" % n for n in range(20)]
        for line in sent:  # each on a connection of its own: on either worker
            assert request(api, "POST", f"/sessions/{session}/stdin", line).status == 204
        assert request(api, "POST", f"/sessions/{session}/eof").status == 204
        got = [json.loads(line) for line in answer]
    finally:
        answer.close()  # (the response holds the socket too)
        stream.close()
    assert got[-1] == {"type": "exit", "code": 0}
    assert output_of(got) == b"".join(sent)


def test_requests_share_a_kept_alive_connection(api: ApiServer) -> None:
    host, port = api.url.split("//")[1].split("/")[0].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        for _ in range(3):  # one connection: the server keeps it for the next request
            conn.request("GET", "/api/v1/sessions",
                         headers={"Authorization": f"Bearer {api.token}"})
            answer = conn.getresponse()
            assert (answer.status, answer.read()) == (200, b'{"sessions":[]}')
            assert answer.getheader("Connection") != "close"
    finally:
        conn.close()


@pytest.mark.asyncio
async def test_delete_cancels_whoever_is_attached(api: ApiServer) -> None:
    session = create(api, argv=["sleep", "30"], pty=False)
    address = api.url.replace("http://", "ws:").removesuffix("/api/v1")
    async with connect(address, token=api.token, multiplex=True) as conn:
        attached = await conn.attach(session)
        answer = await anyio.to_thread.run_sync(
            lambda: request(api, "DELETE", f"/sessions/{session}"))
        assert answer.status == 204
        with pytest.raises(SessionDetached):
            await attached.wait()
    assert request(api, "GET", f"/sessions/{session}").status == 404


def test_delete_answers_once_the_session_has_ended_and_gone(api: ApiServer) -> None:
    """A process that ignores SIGHUP lives until the kill grace's SIGKILL: DELETE answers
    only after that (its observer saw the exit), so a GET right after it finds nothing."""
    session = create(api, argv=["sh", "-c", "trap '' HUP; echo up; while :; do sleep 1; done"],
                     pty=False)
    host, port = api.url.split("//")[1].split("/")[0].split(":")
    stream = http.client.HTTPConnection(host, int(port), timeout=30)
    stream.request("GET", f"/api/v1/sessions/{session}/output",
                   headers={"Authorization": f"Bearer {api.token}"})
    lines = stream.getresponse()
    while json.loads(lines.readline())["type"] != "output":  # the trap is set
        continue
    stream.close()
    assert request(api, "DELETE", f"/sessions/{session}").status == 204
    assert request(api, "GET", f"/sessions/{session}").status == 404
    assert session.encode() not in request(api, "GET", "/sessions").body
