"""Section 13's Idempotency-Key: a retry with the same key starts nothing and answers 200 with
the first session's body, whichever worker it reaches; another key runs again."""

from __future__ import annotations

import http.client
import json
import signal
import time
from pathlib import Path

import pytest
from helpers import SH
from http_api import ApiServer, request

pytestmark = [pytest.mark.timeout(60)]


def post(api: ApiServer, body: dict[str, object], key: str) -> tuple[int, dict[str, object]]:
    answer = request(api, "POST", "/sessions", json.dumps(body).encode(),
                     headers={"Idempotency-Key": key})
    return answer.status, answer.json()


def test_one_key_runs_the_command_once(api: ApiServer, short_dir: Path) -> None:
    log = short_dir / "appended"
    body = {"argv": [SH, "-c", f"echo ran >> {log}; sleep 30"], "pty": False}
    first = post(api, body, "job-1")
    assert first[0] == 201
    for _ in range(4):  # retries, on new connections: with workers, on either worker
        assert post(api, body, "job-1") == (200, first[1])
    other = post(api, body, "job-2")
    assert other[0] == 201 and other[1]["session"] != first[1]["session"]
    deadline = time.monotonic() + 20  # both ran (each writes its line once it has started:
    while (log.read_text() if log.exists() else "") != "ran\nran\n":  # a busy machine
        assert time.monotonic() < deadline, log.read_text()  # may not have got there yet)
        time.sleep(0.02)
    for answer in (first, other):
        ended = request(api, "DELETE", f"/sessions/{answer[1]['session']}")
        assert ended.status == 204
    assert log.read_text() == "ran\nran\n"  # and none more, the retries answered


def test_a_key_is_free_again_once_its_session_is_forgotten(api: ApiServer) -> None:
    body = {"argv": ["true"], "pty": False}
    status, first = post(api, body, "again")
    assert status == 201
    # Ended: DELETE forgets it (its exit released).
    assert request(api, "DELETE", f"/sessions/{first['session']}").status == 204
    assert request(api, "GET", f"/sessions/{first['session']}").status == 404
    status, second = post(api, body, "again")
    assert status == 201 and second["session"] != first["session"]


def test_a_key_outlives_an_upgrade_in_place(api: ApiServer, short_dir: Path) -> None:
    body = {"argv": ["sleep", "30"], "pty": False}
    status, first = post(api, body, "kept")
    assert status == 201
    api.server.proc.send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + 30
    while True:  # (until the upgraded server answers; no event tells a client)
        try:
            answer = request(api, "POST", "/sessions", json.dumps(body).encode(),
                             headers={"Idempotency-Key": "kept"})
        except (OSError, http.client.HTTPException):  # closed while it upgraded
            answer = None
        if (answer is not None and answer.status != 503) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert answer is not None
    assert (answer.status, answer.json()) == (200, first)
    assert request(api, "DELETE", f"/sessions/{first['session']}").status == 204
