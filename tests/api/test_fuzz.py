"""Bad input to the HTTP API: whatever bytes a client sends as a request, and whatever JSON it
sends as a body, it gets an answer with a status (or the connection closed for bytes that are
not HTTP), never a crash; 1,000 malformed requests leave the server serving."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from http_api import ApiServer, request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = [pytest.mark.timeout(300)]
FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])

PATHS = ["/api/v1/sessions", "/api/v1/sessions/x", "/api/v1/sessions/x/output",
         "/api/v1/sessions/x/stdin", "/api/v1/sessions/x/signal", "/api/v1/openapi.json",
         "/api/v1/", "/api/v1/sessions/x/resize?rows=1", "/api/v1/sessions/%00/eof"]
METHODS = ["GET", "POST", "DELETE", "PUT", "HEAD", "OPTIONS", "G\x00T", ""]


def raw(api: ApiServer, data: bytes) -> bytes:
    """Send ``data`` on a connection of its own, close our side, read what comes back."""
    host, port = api.url.split("//")[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def status_of(answer: bytes) -> int | None:
    """The status of the first answer, or None when the server closed without one."""
    if not answer:
        return None
    assert answer.startswith(b"HTTP/1.1 "), answer[:80]
    return int(answer.split(b" ", 2)[1])


requests = st.builds(
    lambda method, path, headers, body: (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode("latin-1")
        + b"".join(headers) + b"Authorization: Bearer http-api-test-token\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode() + body),
    st.sampled_from(METHODS), st.sampled_from(PATHS),
    st.lists(st.sampled_from([b"Accept: text/event-stream\r\n", b"Last-Event-ID: 1,x\r\n",
                              b"Origin: http://elsewhere\r\n", b"Content-Length: 3\r\n",
                              b"Transfer-Encoding: chunked\r\n", b"Host: a\r\n",
                              b"X: \xff\xfe\r\n", b"Authorization: Bearer\r\n"]), max_size=3),
    st.binary(max_size=300))


@FUZZ
@given(data=requests)
def test_any_request_gets_a_status_or_a_close(api: ApiServer, data: bytes) -> None:
    status = status_of(raw(api, data))
    assert status is None or 200 <= status < 600
    assert status != 500


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                              max_size=4), max_leaves=12)
bodies = st.dictionaries(
    st.sampled_from(["argv", "pty", "rows", "cols", "term", "env", "cwd", "detached_timeout",
                     "stdin", "extra"]), json_values, max_size=5)


@FUZZ
@given(body=bodies)
def test_any_json_body_is_started_or_refused_with_its_reason(api: ApiServer,
                                                             body: dict[str, Any]) -> None:
    answer = request(api, "POST", "/api/v1/sessions".removeprefix("/api/v1"),
                     json.dumps(body).encode())
    assert answer.status in (201, 400, 422), answer.body
    if answer.status == 201:  # (an empty argv runs the server's command: end it)
        session = answer.json()["session"]
        assert request(api, "DELETE", f"/sessions/{session}").status in (204, 404)
    else:
        assert answer.json()["error"]["message"]


def test_a_thousand_malformed_requests_leave_it_serving(api: ApiServer) -> None:
    garbage = [b"\x16\x03\x01\x02\x00" * 40, b"GET / HTTP/9.9\r\n\r\n",
               b"POST /api/v1/sessions HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
               b"POST /api/v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{",
               b"GET /api/v1/sessions HTTP/1.1\r\n" + b"X: y\r\n" * 2000 + b"\r\n",
               b"GET /api/v1/" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n",
               b"GET /api/v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # pipelined,
               b"Authorization: Bearer http-api-test-token\r\n\r\n" * 5,  # the token: a
               # failed hello would meet the brake on guessing (its delays grow)
               b"\r\n\r\n\r\n", b"DELETE /api/v1/sessions/ HTTP/1.1\r\nHost: a\r\n\r\n",
               b"POST /api/v1/sessions/x/stdin HTTP/1.1\r\nHost: a\r\n"
               b"Transfer-Encoding: chunked\r\n\r\nzz\r\n"]
    for n in range(1000):
        status = status_of(raw(api, garbage[n % len(garbage)]))
        assert status is None or 200 <= status < 500
    assert request(api, "GET", "/sessions").json() == {"sessions": []}
