"""`ttyserve sessions`: recent sessions from a journal, as a table or JSON lines."""

from __future__ import annotations

import datetime
import json
import sys
from typing import Any

from .exitcodes import ServeExit
from .journal import pair_sessions, read_file


def _duration(start: dict[str, Any], end: dict[str, Any] | None) -> str:
    if end is None:
        return "running"
    try:
        began = datetime.datetime.fromisoformat(str(start["at"]).replace("Z", "+00:00"))
        ended = datetime.datetime.fromisoformat(str(end["at"]).replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return "?"
    return f"{(ended - began).total_seconds():.1f}s"


def _outcome(end: dict[str, Any] | None) -> str:
    if end is None:
        return "-"
    code = end.get("code")
    if end.get("signal"):
        return f"{code} ({end['signal']})"
    return "" if code is None else str(code)


def sessions_main(path: str, as_json: bool, limit: int) -> int:
    try:
        parsed = read_file(path)
    except OSError as exc:
        sys.stderr.write(f"ttyserve sessions: {path}: {exc.strerror}\n")
        return ServeExit.CONFIG
    if parsed.torn:
        sys.stderr.write(f"ttyserve sessions: skipped {parsed.torn} torn line(s) in {path}\n")
    pairs = list(pair_sessions(parsed.records))
    if limit:
        pairs = pairs[-limit:]
    if as_json:
        for start, end in pairs:
            sys.stdout.write(json.dumps({"start": start, "end": end}) + "\n")
        return ServeExit.OK
    rows = [("STARTED", "ID", "PID", "PTY", "REASON", "CODE", "DURATION", "PEER", "COMMAND")]
    for start, end in pairs:
        rows.append((
            str(start.get("at", "?")), str(start.get("id", "?"))[:12], str(start.get("pid", "-")),
            "yes" if start.get("pty") else "no",
            str(end.get("reason")) if end else "running", _outcome(end), _duration(start, end),
            str(start.get("peer", "")), " ".join(map(str, start.get("argv") or [])),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        sys.stdout.write("  ".join([*cells, row[-1]]).rstrip() + "\n")
    return ServeExit.OK
