"""SIGHUP: the principals and targets files read again, in each worker.

A file that cannot be used keeps what was read before (and says why on stderr). A principal
no longer in the file has its connections closed and its sessions hung up as a shutdown
does; a target no longer in it takes no new sessions, and its running sessions keep the
settings they were started with.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from ..errors import ConfigError, ErrorCode, RequestError
from .targets.config import load_targets

if TYPE_CHECKING:
    from .listener import Server

log = logging.getLogger("ttyserve")


def reload(server: Server) -> None:
    """Read the files `serve` was given again, as the module says."""
    if not server.settings.principals and not server.settings.targets:
        log.info("SIGHUP: nothing to read again (no --principals or --targets)")
        return
    if server.settings.targets and (hosts := server.registry.targets) is not None:
        try:
            hosts.replace(load_targets(server.settings.targets))
            log.info("SIGHUP: %d target(s) from %s", len(hosts.file), server.settings.targets)
        except ConfigError as exc:
            log.error("SIGHUP: %s: the targets read before are kept", exc)
    if server.settings.principals:
        _reload_principals(server)


def _reload_principals(server: Server) -> None:
    """The principals read again: who was removed is cut off."""
    old = server.gate.access
    try:
        new = dataclasses.replace(old, principals=server.settings.access.principals)
    except ConfigError as exc:
        log.error("SIGHUP: %s: the principals read before are kept", exc)
        return
    assert old.principals is not None and new.principals is not None
    server.gate.access = new
    gone = {principal.name for principal in old.principals} - {
        principal.name for principal in new.principals}
    log.info("SIGHUP: %d principal(s) from %s%s", len(new.principals),
             server.settings.principals, f"; removed: {', '.join(sorted(gone))}" if gone
             else "")
    for handler in [h for h in server.handlers if h.principal in gone]:
        handler.close(RequestError(ErrorCode.UNAUTHORIZED,
                                   "this connection's principal was removed"))
    for name in gone:
        server.registry.hang_up(name)
