"""Where a user's ttyserve keeps its sockets. Imports nothing: a carrier's far side reads it
before anything else."""

from __future__ import annotations

import os


def runtime_path(name: str) -> str:
    """``name`` in the runtime directory: `$XDG_RUNTIME_DIR`, else `/tmp/ttyserve-$UID`."""
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/ttyserve-{os.getuid()}"
    return os.path.join(runtime, name)


def default_socket_path() -> str:
    """`$XDG_RUNTIME_DIR/ttyserve.sock`, else `/tmp/ttyserve-$UID/ttyserve.sock`."""
    return runtime_path("ttyserve.sock")
