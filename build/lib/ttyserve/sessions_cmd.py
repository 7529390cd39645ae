"""`ttyserve sessions`: recent sessions from a journal, as a table or JSON lines."""

from __future__ import annotations

import datetime
import sys

import msgspec

from .exitcodes import ServeExit
from .journal import SessionEnd, SessionStart, pair_sessions, read_file


def _duration(start: SessionStart, end: SessionEnd | None) -> str:
    if end is None:
        return "running"
    try:
        began = datetime.datetime.fromisoformat(start.at.replace("Z", "+00:00"))
        ended = datetime.datetime.fromisoformat(end.at.replace("Z", "+00:00"))
    except ValueError:
        return "?"
    return f"{(ended - began).total_seconds():.1f}s"


def _outcome(end: SessionEnd | None) -> str:
    if end is None:
        return "-"
    if end.signal:
        return f"{end.code} ({end.signal})"
    return "" if end.code is None else str(end.code)


def sessions_main(path: str, as_json: bool, limit: int) -> int:
    try:
        parsed = read_file(path)
    except OSError as exc:
        sys.stderr.write(f"ttyserve sessions: {path}: {exc.strerror}\n")
        return ServeExit.CONFIG
    if parsed.torn:
        sys.stderr.write(f"ttyserve sessions: skipped {parsed.torn} torn or unreadable "
                         f"line(s) in {path}\n")
    pairs = list(pair_sessions(parsed.records))
    if limit:
        pairs = pairs[-limit:]
    if as_json:
        for start, end in pairs:
            sys.stdout.write(msgspec.json.encode({"start": start, "end": end}).decode() + "\n")
        return ServeExit.OK
    rows = [("STARTED", "ID", "PID", "PTY", "REASON", "CODE", "DURATION", "PEER", "COMMAND")]
    for start, end in pairs:
        rows.append((
            start.at, start.id[:12], "-" if start.pid is None else str(start.pid),
            "yes" if start.pty else "no", end.reason if end else "running", _outcome(end),
            _duration(start, end), start.peer, " ".join(start.argv),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        sys.stdout.write("  ".join([*cells, row[-1]]).rstrip() + "\n")
    return ServeExit.OK
