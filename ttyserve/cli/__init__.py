"""The command line: one module per subcommand, the only place that calls sys.exit."""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
