"""What the HTTP API's tests share: a server with a `ws:` listener and a token, and the
outside programs they drive (curl and jq for docs/http.md's recipes, Node's fetch)."""

from __future__ import annotations

import base64
import http.client
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import ServerProcess, start_server, token_file

TOKEN = "http-api-test-token"


def need(program: str, package: str) -> str:
    """The path of ``program``, or skip (loudly, at the end of the run) without it."""
    path = shutil.which(program)
    if path is None:
        pytest.skip(f"{program} is not installed (apt-get install {package})")
    return path


@dataclass
class ApiServer:
    server: ServerProcess
    url: str  # http://127.0.0.1:PORT/api/v1
    token: str

    @property
    def auth(self) -> str:
        return f"Authorization: Bearer {self.token}"


def api_server(directory: Path, *args: str) -> ApiServer:
    server = start_server(directory, "--token-file", str(token_file(directory, TOKEN)), *args,
                          listen=["ws:127.0.0.1:0"])
    port = server.addresses[0].rsplit(":", 1)[1]
    return ApiServer(server, f"http://127.0.0.1:{port}/api/v1", TOKEN)



@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def request(api: ApiServer, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None, auth: bool = True) -> Answer:
    """One request with the standard library's client (not ours), on a connection of its own."""
    host, port = api.url.split("//")[1].split("/")[0].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        wanted = {"Authorization": f"Bearer {api.token}"} if auth else {}
        conn.request(method, api.url.split(f":{port}", 1)[1] + path, body=body,
                     headers={**wanted, **(headers or {})})
        answer = conn.getresponse()
        return Answer(answer.status, {k.lower(): v for k, v in answer.getheaders()},
                      answer.read())
    finally:
        conn.close()


def create(api: ApiServer, **members: Any) -> str:
    """Start a session; its id."""
    answer = request(api, "POST", "/sessions", json.dumps(members).encode())
    assert answer.status == 201, answer.body
    return str(answer.json()["session"])


def events(api: ApiServer, session_id: str, query: str = "") -> list[dict[str, Any]]:
    """The whole NDJSON output stream of ``session_id``."""
    answer = request(api, "GET", f"/sessions/{session_id}/output{query}")
    assert answer.status == 200, answer.body
    return [json.loads(line) for line in answer.body.splitlines()]


def output_of(stream: list[dict[str, Any]], name: str = "stdout") -> bytes:
    return b"".join(base64.b64decode(e["data"]) for e in stream
                    if e["type"] == "output" and e["stream"] == name)


def open_stream(api: ApiServer, session: str, offsets: tuple[int, int] | None = None,
                sse: bool = False) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """An output stream, its answer's head read (the caller closes both)."""
    host, port = api.url.split("//")[1].split("/")[0].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Authorization": f"Bearer {api.token}"}
    path = f"/api/v1/sessions/{session}/output"
    if sse:
        headers["Accept"] = "text/event-stream"
        if offsets is not None:
            headers["Last-Event-ID"] = f"{offsets[0]},{offsets[1]}"
    elif offsets is not None:
        path += f"?stdout={offsets[0]}&stderr={offsets[1]}"
    conn.request("GET", path, headers=headers)
    answer = conn.getresponse()
    assert answer.status == 200
    return conn, answer
