"""A door's targets at the command line (protocol section 15): `ttyserve targets` lists those
the caller may open, and `exec --target` turns names and selectors (a glob, or LABEL=VALUE)
into the targets to run on, asking the door (`targets`) only when a selector needs it.

Nothing at the top imports an event loop: one `--target NAME` keeps exec's fast start.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ..defaults import DEFAULT_REMOTE_COMMAND
from ..errors import ConfigError, TtyserveError
from ..exitcodes import ExecExit
from .exec_report import ExecFailure, ExecOptions

if TYPE_CHECKING:
    import ssl

    from ..addresses import Address
    from ..client.fanout import DoorTarget
    from ..protocol.messages import TargetInfo

GLOB = frozenset("*?[")


def is_selector(text: str) -> bool:
    """A glob or LABEL=VALUE, which picks targets out of the door's list."""
    return "=" in text or not GLOB.isdisjoint(text)


def one_session(wanted: list[str]) -> bool:
    """Whether `--target` values mean one session (a single name), not a fan-out (a selector
    always fans out, even when it matches one target)."""
    return len(wanted) == 1 and not is_selector(wanted[0])


def check(text: str) -> str:
    """A `--target` value: a name, a glob or LABEL=VALUE, as a principal's `targets` says
    them (server/principals.py); ValueError if a selector is none. A name is the door's to
    judge (no_such_target)."""
    if is_selector(text):
        from ..server.principals import selector

        selector(text)
    return text


async def _listing(address: Address, token: str | None, tls: ssl.SSLContext | None,
                   remote_command: str = DEFAULT_REMOTE_COMMAND) -> list[TargetInfo]:
    from ..client.api import connect

    async with connect(address, token=token, tls=tls, multiplex=True,
                       remote_command=remote_command) as conn:
        return await conn.list_targets()


def _ask(address: Address, token: str | None, tls_ca: str | None,
         remote_command: str = DEFAULT_REMOTE_COMMAND) -> list[TargetInfo]:
    """The door's `targets` answer. Raises OSError, TtyserveError or ConfigError (a CA file)."""
    import anyio

    from ..credentials import tls_context

    tls = tls_context("client", cafile=tls_ca) if address.encrypted else None
    return anyio.run(_listing, address, token, tls, remote_command)


def choose(options: ExecOptions, wanted: list[str]) -> list[DoorTarget]:
    """The door's targets that ``wanted`` names, in the order given, each once: a name as it
    is (the door refuses one it does not know, as for one session), a selector as the
    targets it matches among those the door lists. Raises ExecFailure (255) when the door
    cannot be asked or a selector matches nothing."""
    from ..client.fanout import DoorTarget
    from ..server.principals import selector

    known: list[TargetInfo] = []
    if any(is_selector(text) for text in wanted):
        try:
            known = _ask(options.address, options.token, options.tls_ca,
                         options.remote_command)
        except (OSError, TtyserveError, ConfigError) as exc:
            raise ExecFailure(ExecExit.FAILURE, f"{options.target}: cannot list its targets: "
                                                f"{getattr(exc, 'strerror', None) or exc}"
                              ) from exc
    chosen: dict[str, None] = {}
    for text in wanted:
        if not is_selector(text):
            chosen[text] = None
            continue
        matched = [info.name for info in known
                   if selector(text).matches(info.name, info.labels)]
        if not matched:
            raise ExecFailure(ExecExit.FAILURE, f"--target {text!r} matches no target that "
                              f"{options.target} lets you open (`ttyserve targets` lists them)")
        chosen.update(dict.fromkeys(matched))
    return [DoorTarget(options.address, name) for name in chosen]


def targets_main(address: Address, token: str | None, tls_ca: str | None,
                 as_json: bool) -> int:
    """`ttyserve targets`: ask the door and print what it says: a table, or with ``as_json``
    one object, `{"targets": [...]}`, as the `targets` message carries them."""
    try:
        targets = _ask(address, token, tls_ca)
    except (OSError, TtyserveError, ConfigError) as exc:
        sys.stderr.write(f"ttyserve targets: {address}: "
                         f"{getattr(exc, 'strerror', None) or exc}\n")
        return ExecExit.FAILURE
    if as_json:
        import msgspec

        sys.stdout.write(msgspec.json.encode({"targets": targets}).decode() + "\n")
        return 0
    from .sessions import table

    table([("NAME", "STATE", "LABELS"),
           *[(info.name, info.state, ",".join(f"{k}={v}" for k, v in info.labels.items())
              or "-") for info in targets]])
    return 0
