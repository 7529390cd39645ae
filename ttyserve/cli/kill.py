"""`ttyserve kill`: end one of your sessions from the command line, attached or not (as tmux's
`kill-session`), or send its process a signal.

The protocol has no request for this apart from a channel: `kill` attaches as the writer,
taking the session over from a client attached to it (that client's channel ends with
`detached` "stolen", and it may attach again), then cancels it (the journal says
`cancelled`) or sends the signal and lets go, and the session ends as its process does.
A session that had ended already (kept for a client to read its exit) is let go: its exit
is read, and the server forgets it.
"""

from __future__ import annotations

import ssl
import sys
import typing

import anyio

from ..addresses import Address
from ..client.api import connect
from ..credentials import tls_context
from ..errors import TtyserveError
from ..exitcodes import ExecExit
from ..protocol.messages import SignalName

SIGNALS: tuple[str, ...] = typing.get_args(SignalName)


async def _kill(address: Address, token: str | None, tls: ssl.SSLContext | None,
                session_id: str, signal: SignalName | None) -> None:
    async with connect(address, token=token, tls=tls, multiplex=True) as conn:
        ended = any(info.session == session_id and info.exit is not None
                    for info in await conn.list_sessions())
        session = await conn.attach(session_id, steal=True)
        if ended:  # kept for its exit: read (so released), and it is forgotten
            await session.wait()
            return
        if signal is None:
            await session.cancel()
            return
        await session.signal(signal)
        await session.detach()


def kill_main(address: Address, token: str | None, tls_ca: str | None, session_id: str,
              signal: SignalName | None) -> int:
    """Cancel ``session_id``, or send its process ``signal``; 0, or 255 with a line."""
    try:
        tls = tls_context("client", cafile=tls_ca) if address.encrypted else None
        anyio.run(_kill, address, token, tls, session_id, signal)
    except (OSError, TtyserveError) as exc:
        sys.stderr.write(f"ttyserve kill: {exc}\n")
        return ExecExit.FAILURE
    return 0
