"""Section 13's output stream is exact: read through cuts and asked again from the offsets it
delivered (as NDJSON with the query, and as server-sent events with Last-Event-ID), every
line comes once and the exit last; binary output and a large stdin body are exact."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from http_api import ApiServer, api_server, create, events, open_stream, output_of, request

pytestmark = [pytest.mark.timeout(120)]

LINES = 2_600_000  # `seq 1 2600000`: 18.9 MB of numbered lines
EXPECTED = b"".join(b"%d\n" % n for n in range(1, LINES + 1))


@pytest.fixture
def roomy(short_dir: Path, workers: int) -> Iterator[ApiServer]:
    """A server whose scrollback holds the whole output: what the process writes while a
    cut reader comes back is kept, not overrun."""
    served = api_server(short_dir, "--scrollback", str(32 << 20))
    try:
        yield served
    finally:
        served.server.stop()


def next_event(answer: http.client.HTTPResponse, sse: bool) -> tuple[dict[str, Any], str]:
    """The next event, and (SSE) its id."""
    if not sse:
        return json.loads(answer.readline()), ""
    data = ident = ""
    while (line := answer.readline().decode()) not in ("\n", ""):
        field, _, value = line.rstrip("\n").partition(": ")
        data, ident = (value, ident) if field == "data" else (data, value)
    return json.loads(data), ident


def read_with_cuts(api: ApiServer, session: str, sse: bool, cuts: int) -> list[dict[str, Any]]:
    """The whole stream, the connection closed after a random number of events `cuts`
    times, each time asked again from the offsets after the last event it delivered."""
    rng = random.Random(7)
    got: list[dict[str, Any]] = []
    offsets: tuple[int, int] | None = None
    for attempt in range(cuts + 1):
        conn, answer = open_stream(api, session, offsets, sse)
        try:
            first, _ = next_event(answer, sse)
            assert first["type"] == "attached"
            assert offsets is None or (first["offsets"]["stdout"],
                                       first["offsets"]["stderr"]) == offsets
            budget = rng.randint(20, 200) if attempt < cuts else None
            while budget is None or budget > 0:
                event, ident = next_event(answer, sse)
                got.append(event)
                if event["type"] == "exit":
                    return got
                held = {"stdout": offsets[0] if offsets else 0,
                        "stderr": offsets[1] if offsets else 0}
                if event["type"] == "output":
                    held[event["stream"]] = (event["offset"]
                                             + len(base64.b64decode(event["data"])))
                offsets = (held["stdout"], held["stderr"])
                if sse:
                    assert ident == f"{offsets[0]},{offsets[1]}"
                budget = None if budget is None else budget - 1
        finally:  # mid-stream: the server detaches the session, loses nothing
            answer.close()  # (the response holds the socket too)
            conn.close()
    raise AssertionError("no exit after the last cut")


@pytest.mark.parametrize("sse", [False, True], ids=["ndjson", "sse"])
def test_twenty_megabytes_through_cuts_every_line_once(roomy: ApiServer, sse: bool) -> None:
    session = create(roomy, argv=["seq", "1", str(LINES)], pty=False)
    got = read_with_cuts(roomy, session, sse, cuts=6)
    assert got[-1] == {"type": "exit", "code": 0}
    assert [e["type"] for e in got[:-1]] == ["output"] * (len(got) - 1)
    assert output_of(got) == EXPECTED


def test_every_byte_value_comes_through(api: ApiServer) -> None:
    data = bytes(range(256)) * 4096
    program = "import sys; sys.stdout.buffer.write(bytes(range(256)) * 4096)"
    session = create(api, argv=["python3", "-c", program], pty=False)
    assert output_of(events(api, session)) == data


def test_a_five_mebibyte_stdin_body_is_taken_whole(api: ApiServer) -> None:
    data = random.Random(5).randbytes(5 << 20)
    session = create(api, argv=["sha256sum"], pty=False)
    assert request(api, "POST", f"/sessions/{session}/stdin", data).status == 204
    assert request(api, "POST", f"/sessions/{session}/eof").status == 204
    digest = hashlib.sha256(data).hexdigest().encode()
    assert output_of(events(api, session)) == digest + b"  -\n"


def test_a_reader_that_stops_holds_only_its_own_session(api: ApiServer) -> None:
    """Flow control from the HTTP reader to the process: a flood whose stream is not read
    stops where the window and the socket buffers are full, and other sessions go on."""
    flood = create(api, argv=["cat", "/dev/zero"], pty=False)
    stalled, answer = open_stream(api, flood)
    try:
        assert json.loads(answer.readline())["type"] == "attached"  # and nothing more read
        other = create(api, argv=["seq", "1", "20000"], pty=False)
        assert output_of(events(api, other)) == b"".join(
            b"%d\n" % n for n in range(1, 20_001))
        before = request(api, "GET", f"/sessions/{flood}").json()["offsets"]["stdout"]
        timer = create(api, argv=["sleep", "30"], pty=False)  # a second, by `wait`
        assert request(api, "GET", f"/sessions/{timer}?wait=1").json()["exit"] is None
        after = request(api, "GET", f"/sessions/{flood}").json()["offsets"]["stdout"]
        assert after - before < 16 << 20, (before, after)  # unpaced: hundreds of MB a second
        assert request(api, "DELETE", f"/sessions/{timer}").status == 204
    finally:
        answer.close()  # (the response holds the socket too)
        stalled.close()
    assert request(api, "DELETE", f"/sessions/{flood}").status == 204
