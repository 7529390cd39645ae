"""A client generated from the OpenAPI document by a common Python generator
(openapi-python-client) gets what coordinators branch on as typed fields: `exit.code` an
integer, `started` a date-time, the output events as models of their own (issue 41, item 8).
The document is the live server's own."""

from __future__ import annotations

import datetime
import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SH
from http_api import ApiServer, request

pytestmark = [pytest.mark.timeout(120)]


def test_a_generated_client_reads_the_exit_as_typed_fields(api: ApiServer,
                                                           tmp_path: Path) -> None:
    generator = shutil.which("openapi-python-client",
                             path=str(Path(sys.executable).parent))
    assert generator is not None, "openapi-python-client is in the test extra"
    document = tmp_path / "openapi.json"
    answer = request(api, "GET", "/openapi.json", auth=False)
    assert answer.status == 200
    document.write_bytes(answer.body)
    made = subprocess.run([generator, "generate", "--path", str(document), "--meta", "none",
                           "--output-path", str(tmp_path / "ttyserve_api")],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": str(Path(sys.executable).parent)})  # (its ruff pass)
    assert (tmp_path / "ttyserve_api" / "models" / "exit_status.py").exists(), made.stdout
    sys.path.insert(0, str(tmp_path))
    try:
        generated = importlib.import_module("ttyserve_api")
        sessions = importlib.import_module("ttyserve_api.api.default.post_api_v1_sessions")
        status_of = importlib.import_module("ttyserve_api.api.default.get_api_v1_sessions_id")
        models = importlib.import_module("ttyserve_api.models")
        client = generated.AuthenticatedClient(base_url=api.url.removesuffix("/api/v1"),
                                               token=api.token)
        created = sessions.sync(client=client, body=models.CreateSession(
            argv=[SH, "-c", "echo hi; exit 4"], pty=False))
        assert isinstance(created, models.Created), created
        status = status_of.sync(created.session, client=client, wait=10.0)
        assert isinstance(status, models.SessionStatus), status
        assert isinstance(status.exit_, models.ExitStatus)
        assert isinstance(status.exit_.code, int) and status.exit_.code == 4
        assert isinstance(status.started, datetime.datetime)
        assert hasattr(models, "OutputEvent") and hasattr(models, "ExitEvent")
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.split(".")[0] == "ttyserve_api"]:
            del sys.modules[name]
