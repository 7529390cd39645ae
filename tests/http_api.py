"""What the HTTP API's tests share: a server with a `ws:` listener and a token, and the
outside programs they drive (curl and jq for docs/http.md's recipes, Node's fetch)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

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

