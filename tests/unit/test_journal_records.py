"""Journal records are msgspec structs whose JSON is exactly the contract's, both ways."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from ttyserve.server.journal import (
    Journal,
    OpenStarts,
    Reason,
    SessionEnd,
    SessionStart,
    open_sessions,
    pair_sessions,
    parse,
    read_file,
)

AT = "2026-11-30T17:00:00.000Z"


def test_reasons_are_the_contract_s_words() -> None:
    assert [str(r) for r in Reason] == [
        "exit", "cancelled", "spawn_failed", "shutdown", "crash-inferred", "abandoned"]
    assert Reason("crash-inferred") is Reason.CRASH_INFERRED


def test_a_start_is_written_in_the_contract_s_format() -> None:
    start = SessionStart(id="a1", at=AT, peer="unix(uid=1000,pid=42)", argv=["make"], pty=False,
                         pid=1234, start_time=123456)
    assert msgspec.json.encode(start) == (
        b'{"event":"session.start","id":"a1","at":"2026-11-30T17:00:00.000Z",'
        b'"peer":"unix(uid=1000,pid=42)","argv":["make"],"pty":false,"pid":1234,'
        b'"start_time":123456}')


def test_a_failed_spawn_writes_a_null_pid_and_no_start_time() -> None:
    start = SessionStart(id="a1", at=AT, peer="p", argv=["nope"], pty=True, pid=None)
    assert msgspec.json.encode(start).endswith(b'"pty":true,"pid":null}')


def test_an_end_omits_the_members_it_does_not_have() -> None:
    end = SessionEnd(id="a1", at=AT, reason=Reason.EXIT, code=0, bytes_in=12, bytes_out=3456)
    assert msgspec.json.encode(end) == (
        b'{"event":"session.end","id":"a1","at":"2026-11-30T17:00:00.000Z","reason":"exit",'
        b'"code":0,"bytes_in":12,"bytes_out":3456}')
    killed = SessionEnd(id="a2", at=AT, reason=Reason.EXIT, code=-9, signal="KILL")
    assert msgspec.json.encode(killed).endswith(b'"reason":"exit","code":-9,"signal":"KILL"}')
    failed = SessionEnd(id="a3", at=AT, reason=Reason.SPAWN_FAILED, errno=2)
    assert msgspec.json.encode(failed).endswith(b'"reason":"spawn_failed","errno":2}')


def test_parse_gives_structs_ignores_unknown_members_and_skips_bad_lines() -> None:
    data = (
        b'{"event":"session.start","id":"a","at":"t0","peer":"p","argv":["sh"],"pty":true,'
        b'"pid":7,"start_time":99,"added_later":{"x":1}}\n'
        b'{"event":"session.end","id":"a","at":"t1","reason":"crash-inferred"}\n'
        b'\n'
        b'{"event":"session.paused","id":"b","at":"t2"}\n'  # an event we do not know
        b'["not", "an", "object"]\n'
        b'{"event":"session.start","id":"b","at":"t3","peer":"p","argv":[],"pty":false,"pi'
    )
    parsed = parse(data)
    assert parsed.records == [
        SessionStart(id="a", at="t0", peer="p", argv=["sh"], pty=True, pid=7, start_time=99),
        SessionEnd(id="a", at="t1", reason=Reason.CRASH_INFERRED),
    ]
    assert (parsed.torn, parsed.ends_with_newline) == (3, False)


def test_sessions_are_paired_in_start_order() -> None:
    first = SessionStart(id="a", at="t0", peer="p", argv=[], pty=False, pid=1)
    second = SessionStart(id="b", at="t1", peer="p", argv=[], pty=False, pid=2)
    end = SessionEnd(id="a", at="t2", reason=Reason.CANCELLED)
    records: list[SessionStart | SessionEnd] = [first, second, end]
    assert list(pair_sessions(records)) == [(first, end), (second, None)]
    assert open_sessions(records) == [second]


def test_recover_ends_what_a_crash_left_open(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    ended = SessionStart(id="a", at=AT, peer="p", argv=["true"], pty=False, pid=None)
    left = SessionStart(id="b", at=AT, peer="p", argv=["sleep"], pty=False, pid=None)
    path.write_bytes(b"".join(msgspec.json.encode(r) + b"\n" for r in (
        ended, SessionEnd(id="a", at=AT, reason=Reason.EXIT, code=0), left))
        + b'{"event":"session.start","id":"c"')  # torn by the crash
    journal = Journal(str(path))
    try:
        ends = journal.recover(grace=0)
    finally:
        journal.close()
    assert [(e.id, e.reason) for e in ends] == [("b", Reason.CRASH_INFERRED)]
    last = path.read_bytes().splitlines()[-1]
    assert msgspec.json.decode(last) == {"event": "session.end", "id": "b", "at": ends[0].at,
                                         "reason": "crash-inferred"}
    parsed = read_file(str(path))
    assert parsed.torn == 1 and open_sessions(parsed.records) == []


def test_the_open_starts_follow_the_journal_reading_only_what_was_appended(
        tmp_path: Path) -> None:
    """A supervisor's view of its workers' sessions (`Journal.crashed`): each look reads
    from where the last stopped, a line cut by the end of what was there is finished by the
    next look, and what ended is dropped, so memory holds the open sessions alone."""
    path = tmp_path / "journal"
    start = [msgspec.json.encode(SessionStart(
        id=f"s1.{n}", at="t", peer="p", argv=["true"], pty=False, pid=None)) for n in range(3)]
    end = msgspec.json.encode(SessionEnd(id="s1.0", at="t", reason=Reason.EXIT))
    path.write_bytes(start[0] + b"\n" + start[1] + b"\n" + start[2][:10])
    fd = os.open(path, os.O_RDONLY)
    try:
        starts = OpenStarts()
        assert list(starts.follow(fd)) == ["s1.0", "s1.1"]
        with open(path, "ab") as file:
            file.write(start[2][10:] + b"\n" + end + b"\n")
        assert list(starts.follow(fd)) == ["s1.1", "s1.2"]
        assert starts.offset == path.stat().st_size  # (nothing read twice)
    finally:
        os.close(fd)
