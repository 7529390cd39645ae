"""`ttyserve share` and `ttyserve unshare`: make a grant for one of your sessions, or revoke
one (protocol section 11). The grant goes to stdout, what it means to stderr."""

from __future__ import annotations

import re
import ssl
import sys

import anyio
import msgspec

from ..addresses import Address
from ..client.api import connect
from ..credentials import tls_context
from ..errors import TtyserveError
from ..exitcodes import ExecExit
from ..protocol.messages import OBSERVER, WRITER, Shared, Unshared

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+)([smhd]?)")


def parse_duration(text: str) -> int:
    """Seconds in ``30m``, ``1h``, ``90`` (seconds), ``2d``; ValueError naming the text."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or int(match.group(1)) == 0:
        raise ValueError(f"{text!r} is not a duration such as 90, 30m, 1h or 2d")
    return int(match.group(1)) * _UNITS[match.group(2)]


def browse_url(address: Address, shared: Shared) -> str | None:
    """The page's link for a `ws:`/`wss:` address: the grant in the fragment, never sent to
    a server or put in a Referer."""
    if not address.web:
        return None
    scheme = "https" if address.encrypted else "http"
    return f"{scheme}://{address.netloc}/#grant={shared.grant}&session={shared.session}"


def _tls(address: Address, tls_ca: str | None) -> ssl.SSLContext | None:
    return tls_context("client", cafile=tls_ca) if address.encrypted else None


async def _share(address: Address, token: str | None, tls: ssl.SSLContext | None,
                 session: str, writer: bool, ttl: int | None) -> Shared:
    async with connect(address, token=token, tls=tls, multiplex=True) as conn:
        return await conn.share(session, role=WRITER if writer else OBSERVER, ttl=ttl)


async def _unshare(address: Address, token: str | None, tls: ssl.SSLContext | None,
                   grant: str) -> Unshared:
    async with connect(address, token=token, tls=tls, multiplex=True) as conn:
        return await conn.unshare(grant)


def share_main(address: Address, token: str | None, tls_ca: str | None, session: str,
               writer: bool, ttl: int | None, as_json: bool) -> int:
    """Print a new grant for ``session`` (and the page's link for a WebSocket address)."""
    try:
        shared = anyio.run(_share, address, token, _tls(address, tls_ca), session, writer, ttl)
    except (OSError, TtyserveError) as exc:
        sys.stderr.write(f"ttyserve share: {address}: {exc}\n")
        return ExecExit.FAILURE
    url = browse_url(address, shared)
    if as_json:
        fields = msgspec.to_builtins(shared)
        del fields["type"]
        sys.stdout.write(msgspec.json.encode({**fields, **({"browse": url} if url else {})})
                         .decode() + "\n")
    else:
        sys.stdout.write(shared.grant + "\n")
        if url is not None:
            sys.stdout.write(f"browse {url}\n")
    sys.stderr.write(f"ttyserve: {shared.role} grant {shared.id} for session {shared.session} "
                     f"until {shared.expires} (revoke: ttyserve unshare {shared.id})\n")
    return 0


def unshare_main(address: Address, token: str | None, tls_ca: str | None, grant: str) -> int:
    """Revoke a grant (by the grant or its public id)."""
    try:
        answer = anyio.run(_unshare, address, token, _tls(address, tls_ca), grant)
    except (OSError, TtyserveError) as exc:
        sys.stderr.write(f"ttyserve unshare: {address}: {exc}\n")
        return ExecExit.FAILURE
    sys.stderr.write(f"ttyserve: grant {answer.id} revoked ({answer.channels} "
                     f"channel{'s' * (answer.channels != 1)} detached)\n")
    return 0
