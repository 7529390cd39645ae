"""The command line: one module per subcommand, the only place that calls sys.exit."""

from __future__ import annotations

import os
import sys

from ..defaults import PERSIST_ARGUMENTS

TYPE_CHECKING = False  # (typing's costs its import; mypy reads any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import NoReturn


def main(argv: Sequence[str] | None = None) -> None:
    """`ttyserve ...`: a carrier's `serve --stdio` goes to a warm server when one answers
    (cli/warm.py), and its `serve --stdio --persist` to the server answering on the
    default socket (cli/persist.py), before anything else is imported; everything else
    to cli/main.py."""
    args = list(sys.argv[1:] if argv is None else argv)
    if tuple(args) == PERSIST_ARGUMENTS:  # a carrier's reconnect: relay to the server there
        from . import persist

        try:
            if persist.relay_to_running_server():
                _exit_now(0)  # ServeExit.OK (whose module imports enum: a quarter of the relay)
        except OSError:
            pass  # said by the full path below, which tries again
    from . import warm

    if warm.eligible(args) and (code := warm.handed_over(args)) is not None:
        _exit_now(code)
    from .main import main as run

    run(args)


def _exit_now(code: int) -> NoReturn:
    """Exit with ``code`` once the work was done elsewhere (a warm child, the server relayed
    to), skipping the interpreter's teardown: 2 ms of a 12 ms process here, paid by every
    carrier's far side and every warm `exec`. Nothing of this process is left to run but
    its standard streams' buffers."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


__all__ = ["main"]
