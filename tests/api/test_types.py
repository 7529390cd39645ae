"""One set of types (section 13): the OpenAPI document is made from the bodies the API
decodes and encodes, which are the protocol's messages' members; and the API is served on
`wss:` as on `ws:`, with the same limits as every listener."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import msgspec
import pytest
from helpers import start_server, tls_files, token_file
from http_api import TOKEN, ApiServer, need, request

from ttyserve.api.types import CreateSession
from ttyserve.defaults import DEFAULT_MAX_ARGV_BYTES
from ttyserve.protocol.messages import Exit, Open

pytestmark = [pytest.mark.timeout(60)]


def test_the_openapi_document_is_the_types(api: ApiServer) -> None:
    document = request(api, "GET", "/openapi.json", auth=False).json()  # (needs no token)
    assert document["openapi"] == "3.1.0"
    schemas = document["components"]["schemas"]
    create = set(schemas["CreateSession"]["properties"])
    assert create == {f.name for f in msgspec.structs.fields(Open)} - {
        "detachable", "idempotency_key"} | {"stdin"}
    assert set(schemas["ExitEvent"]["properties"]) == {
        f.name for f in msgspec.structs.fields(Exit)} | {"type"}
    assert set(document["paths"]) == {
        "/api/v1/sessions", "/api/v1/sessions/{id}", "/api/v1/sessions/{id}/output",
        "/api/v1/sessions/{id}/stdin", "/api/v1/sessions/{id}/eof",
        "/api/v1/sessions/{id}/signal", "/api/v1/sessions/{id}/resize", "/api/v1/targets"}
    assert msgspec.json.decode(b'{"argv": ["x"]}', type=CreateSession).pty is True


def test_argv_over_the_listeners_limit_is_refused(api: ApiServer) -> None:
    body = json.dumps({"argv": ["echo", "x" * DEFAULT_MAX_ARGV_BYTES]}).encode()
    answer = request(api, "POST", "/sessions", body)
    assert (answer.status, answer.json()["error"]["code"]) == (400, "bad_request")
    assert "argv" in answer.json()["error"]["message"]


def test_the_api_is_served_on_wss(short_dir: Path, workers: int) -> None:
    curl = need("curl", "curl")
    tls_files(short_dir)
    server = start_server(short_dir, "--tls-cert", str(short_dir / "cert.pem"), "--tls-key",
                          str(short_dir / "key.pem"), "--token-file",
                          str(token_file(short_dir, TOKEN)), listen=["wss:127.0.0.1:0"])
    try:
        url = f"https://127.0.0.1:{server.addresses[0].rsplit(':', 1)[1]}/api/v1"
        auth = ["--cacert", str(short_dir / "ca.pem"), "-H", f"Authorization: Bearer {TOKEN}"]
        created = subprocess.run(
            [curl, "-sf", *auth, "-d", '{"argv": ["echo", "over-tls"], "pty": false}',
             f"{url}/sessions"], capture_output=True, check=True, timeout=30)
        session = json.loads(created.stdout)["session"]
        stream = subprocess.run([curl, "-sfN", *auth, f"{url}/sessions/{session}/output"],
                                capture_output=True, check=True, timeout=30)
        events = [json.loads(line) for line in stream.stdout.splitlines()]
        assert events[1]["data"] == "b3Zlci10bHMK" and events[-1] == {"type": "exit",
                                                                      "code": 0}
    finally:
        server.stop()
