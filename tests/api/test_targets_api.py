"""The HTTP API on a door (protocol section 15): `POST /api/v1/sessions` takes `target`,
`GET /api/v1/targets` answers as the `targets` message does, `no_such_target` is 404 and
`target_unreachable` 503 with Retry-After (422 when no retry can help); the OpenAPI
document says all of it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import token_file
from http_api import TOKEN, ApiServer, events, need, output_of, request
from target_doors import door

pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("workers")]
HOSTS = {"web-1": {"labels": {"role": "web"}, "persist": True},
         "crashes": {"via": "via:false"},  # its carrier exits 1: crashed, retriable
         "gone": {"remote_command": "/nonexistent/ttyserve"}}  # exits 127: not_installed


def test_sessions_on_targets_and_the_list_of_targets(short_dir: Path) -> None:
    curl = need("curl", "curl")
    with door(short_dir, HOSTS, "--token-file", str(token_file(short_dir, TOKEN)),
              listen=["ws:127.0.0.1:0"]) as server:
        api = ApiServer(server, f"http://127.0.0.1:{server.addresses[0].rsplit(':', 1)[1]}"
                                "/api/v1", TOKEN)
        listed = subprocess.run([curl, "-sf", "-H", api.auth, f"{api.url}/targets"],
                                capture_output=True, check=True, timeout=30)
        assert json.loads(listed.stdout) == {"targets": [
            {"name": "crashes", "labels": {}, "state": "idle"},
            {"name": "gone", "labels": {}, "state": "idle"},
            {"name": "web-1", "labels": {"role": "web"}, "state": "idle"}]}
        created = request(api, "POST", "/sessions", json.dumps(
            {"argv": ["sh", "-c", 'echo "on $WHERE"; exit 3'], "pty": False,
             "target": "web-1"}).encode())
        assert created.status == 201, created.body
        session = created.json()["session"]
        stream = events(api, session)
        assert output_of(stream) == b"on web-1\n"
        assert stream[-1] == {"type": "exit", "code": 3}
        (entry,) = request(api, "GET", "/sessions").json()["sessions"]
        assert (entry["session"], entry["target"]) == (session, "web-1")
        assert request(api, "DELETE", f"/sessions/{session}").status == 204


def test_target_refusals_have_their_statuses(short_dir: Path) -> None:
    with door(short_dir, HOSTS, "--token-file", str(token_file(short_dir, TOKEN)),
              listen=["ws:127.0.0.1:0"]) as server:
        api = ApiServer(server, f"http://127.0.0.1:{server.addresses[0].rsplit(':', 1)[1]}"
                                "/api/v1", TOKEN)

        def create(target: str) -> tuple[int, dict[str, object], str | None]:
            answer = request(api, "POST", "/sessions", json.dumps(
                {"argv": ["true"], "pty": False, "target": target}).encode())
            return answer.status, answer.json()["error"], answer.headers.get("retry-after")

        status, error, retry = create("nope")
        assert (status, error["code"], error["retriable"], retry) == (
            404, "no_such_target", False, None)
        status, error, retry = create("crashes")
        assert (status, error["code"], error["retriable"], retry) == (
            503, "target_unreachable", True, "1")
        assert "crashed" in str(error["message"])
        status, error, retry = create("gone")
        assert (status, error["code"], error["retriable"], retry) == (
            422, "target_unreachable", False, None)
        assert "not_installed" in str(error["message"])
        assert request(api, "POST", "/targets", b"{}").status == 405


def test_the_openapi_document_has_targets(short_dir: Path) -> None:
    with door(short_dir, {}, "--token-file", str(token_file(short_dir, TOKEN)),
              listen=["ws:127.0.0.1:0"]) as server:
        api = ApiServer(server, f"http://127.0.0.1:{server.addresses[0].rsplit(':', 1)[1]}"
                                "/api/v1", TOKEN)
        document = request(api, "GET", "/openapi.json", auth=False).json()
        listing = document["paths"]["/api/v1/targets"]["get"]["responses"]["200"]
        assert listing["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/TargetList"}
        schemas = document["components"]["schemas"]
        assert set(schemas["TargetInfo"]["properties"]) == {"name", "labels", "state"}
        assert "target" in schemas["CreateSession"]["properties"]
        assert request(api, "GET", "/targets").json() == {"targets": []}
