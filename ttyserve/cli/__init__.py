"""The command line: one module per subcommand, the only place that calls sys.exit."""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # (typing's costs its import; mypy reads any TYPE_CHECKING as true)
if TYPE_CHECKING:
    from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> None:
    """`ttyserve ...`: a carrier's `serve --stdio` goes to a warm server when one answers
    (cli/warm.py), before anything else is imported; everything else to cli/main.py."""
    args = list(sys.argv[1:] if argv is None else argv)
    from . import warm

    if warm.eligible(args) and (code := warm.handed_over(args)) is not None:
        sys.exit(code)
    from .main import main as run

    run(args)


__all__ = ["main"]
