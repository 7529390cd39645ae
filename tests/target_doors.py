"""Doors with targets on this machine (protocol section 15): each target's far side is this
venv's ttyserve, reached through `via:env` and a wrapper that gives it a runtime directory
of its own. A target that persists starts a background server there, which is stopped
after the test. The door passes none of its `TTYSERVE_*` variables on, so the wrapper says
TTYSERVE_WARM=0 itself (a plain `serve --stdio` would leave a warm server behind)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from helpers import (
    ServerProcess,
    children_of,
    server_pid,
    start_server,
    stop_warm_servers,
    wait_until_gone,
)

VENV_TTYSERVE = Path(sys.executable).with_name("ttyserve")


def entry(name: str, remote_command: Path | str, labels: dict[str, str] | None = None,
          persist: bool = False, via: str | None = None) -> str:
    """A `[targets.NAME]` table; its carrier (default `via:env WHERE=NAME`) tells the far
    side's processes which target they run on ($WHERE)."""
    via = via or f"via:env WHERE={name}"
    pairs = ", ".join(f'{k} = "{v}"' for k, v in (labels or {}).items())
    return (f'[targets.{name}]\nvia = "{via}"\nremote_command = "{remote_command}"\n'
            f"persist = {str(persist).lower()}\nlabels = {{ {pairs} }}\n")


@dataclass
class Far:
    """One far side on this machine."""

    name: str
    runtime: Path  # its own server's runtime directory (the default socket is there)
    wrapper: Path  # the remote command: this venv's ttyserve in that runtime directory

    def entry(self, labels: dict[str, str] | None = None, persist: bool = True,
              via: str = "via:env") -> str:
        """Its `[targets.NAME]` table."""
        return entry(self.name, self.wrapper, labels, persist, via)

    def stop(self) -> None:
        """Stop the server it started, if it did, and remove its directory."""
        pid = server_pid(self.runtime / "ttyserve.sock")
        if pid is not None:
            os.kill(pid, signal.SIGTERM)  # the server a far side started: ours to end
            assert wait_until_gone(pid)
        stop_warm_servers(self.runtime)  # (none with TTYSERVE_WARM=0: should it be ignored)
        shutil.rmtree(self.runtime, ignore_errors=True)


def far_side(name: str, env: str = "") -> Far:
    """A far side's runtime directory and wrapper (``env``: more `NAME=VALUE` for it)."""
    runtime = Path(tempfile.mkdtemp(prefix="tts-far-", dir="/tmp"))
    runtime.chmod(0o700)
    wrapper = runtime / "ttyserve-far"
    wrapper.write_text(f"#!/bin/sh\nXDG_RUNTIME_DIR={runtime} TTYSERVE_WARM=0 {env} "
                       f'exec {VENV_TTYSERVE} "$@"\n')
    wrapper.chmod(0o755)
    return Far(name, runtime, wrapper)


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for child in children_of(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def carriers(door: ServerProcess, far: Far) -> list[int]:
    """The door's running carriers to ``far`` (processes the test started, through it): its
    descendants that run `serve --stdio` in ``far``'s runtime directory (the wrapper execs
    it, so only its environment names the directory)."""
    found = []
    for pid in descendants(door.pid):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"XDG_RUNTIME_DIR={far.runtime}".encode() in environ and b"--stdio" in cmdline:
            found.append(pid)
    return found


@contextlib.contextmanager
def door(directory: Path, targets: dict[str, dict[str, object]], *args: str,
         **start: object) -> Iterator[ServerProcess]:
    """A door (start_server with ``args`` and ``start``) on a targets file of ``targets``:
    name -> entry()'s keywords (remote_command: one shared far side's wrapper unless
    given). Its far sides' default command is /bin/sh, with PS1 `$ `."""
    far = far_side("shared", "TTYSERVE_COMMAND=/bin/sh PS1='$ '")
    text = "".join(entry(name, **{"remote_command": far.wrapper, **kw})  # type: ignore[arg-type]
                   for name, kw in targets.items())
    (directory / "targets.toml").write_text(text)
    server = None
    try:
        server = start_server(directory, "--targets", str(directory / "targets.toml"), *args,
                              **start)  # type: ignore[arg-type]
        yield server
    finally:
        if server is not None:
            server.stop()
        far.stop()
