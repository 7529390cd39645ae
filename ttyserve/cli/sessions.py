"""`ttyserve sessions`: recent sessions from a journal, or (--live) a server's detachable
sessions for the caller, as a table or JSON lines."""

from __future__ import annotations

import datetime
import shlex
import ssl
import sys
from collections.abc import Sequence

import anyio
import msgspec

from ..addresses import Address
from ..client.api import connect
from ..credentials import tls_context
from ..errors import TtyserveError
from ..exitcodes import ExecExit, ServeExit
from ..protocol.messages import SessionInfo
from ..server.journal import SessionEnd, SessionStart, pair_sessions, read_file


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
            start.at, start.id, "-" if start.pid is None else str(start.pid),
            "yes" if start.pty else "no", end.reason if end else "running", _outcome(end),
            _duration(start, end), start.peer, " ".join(start.argv),
        ))
    table(rows)
    return ServeExit.OK


def table(rows: Sequence[tuple[str, ...]]) -> None:
    """Columns padded to their widest cell; the last one (the command) is not padded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        sys.stdout.write("  ".join([*cells, row[-1]]).rstrip() + "\n")


def _state(info: SessionInfo) -> str:
    if info.exit is None:
        return "attached" if info.attached else "detached"
    if info.exit.get("signal"):
        return f"killed by {info.exit['signal']}"
    return f"exited {info.exit.get('code')}"


def _grants(info: SessionInfo) -> str:
    """Each open grant: its id, role and expiry (never the grant itself)."""
    return ",".join(f"{g.id}:{g.role}:{g.expires}" for g in info.grants) or "-"


async def _live(address: Address, token: str | None, tls: ssl.SSLContext | None,
                ) -> list[SessionInfo]:
    async with connect(address, token=token, tls=tls, multiplex=True) as conn:
        return await conn.list_sessions()


def live_main(address: Address, token: str | None, tls_ca: str | None, as_json: bool) -> int:
    """`sessions --live`: ask the server (`list`) and print what it says."""
    try:
        tls = tls_context("client", cafile=tls_ca) if address.encrypted else None
        sessions = anyio.run(_live, address, token, tls)
    except (OSError, TtyserveError) as exc:
        sys.stderr.write(f"ttyserve sessions: {address}: {exc}\n")
        return ExecExit.FAILURE
    if as_json:
        for info in sessions:
            sys.stdout.write(msgspec.json.encode(info).decode() + "\n")
        return 0
    rows = [("SESSION", "TARGET", "PID", "PTY", "STARTED", "STATE", "WATCHING", "GRANTS",
             "COMMAND")]
    rows += [(info.session, info.target or "-", str(info.pid), "yes" if info.pty else "no",
              info.started, _state(info), str(info.observers), _grants(info),
              shlex.join(info.argv))
             for info in sessions]
    table(rows)
    return 0
