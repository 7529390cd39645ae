"""Command line: `ttyserve serve` and `ttyserve exec`. The only place that calls sys.exit."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import __version__
from .addresses import AddressError, default_address, parse_address
from .exec_cmd import ExecOptions, exec_main
from .exitcodes import ExecExit, ServeExit
from .serve_cmd import ServeOptions, serve_main
from .server import DEFAULT_SHUTDOWN_TIMEOUT
from .session import DEFAULT_LINGER


class _Parser(argparse.ArgumentParser):
    """argparse that exits with our usage code, whatever the subcommand's table says."""

    usage_exit: int = ServeExit.USAGE

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(self.usage_exit)


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative number of seconds")
    return value


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ttyserve", description=__doc__)
    parser.add_argument("--version", action="version", version=f"ttyserve {__version__}")
    commands = parser.add_subparsers(dest="subcommand", required=True, parser_class=_Parser)

    serve = commands.add_parser("serve", help="run the server")
    serve.add_argument("--listen", action="append", metavar="ADDR", default=[],
                       help="unix:PATH or tcp:HOST:PORT (repeatable; default: the user's socket)")
    serve.add_argument("--command", metavar="CMD",
                       help="default command when a client sends no argv (default: login shell)")
    serve.add_argument("--linger", type=_seconds, default=DEFAULT_LINGER, metavar="SECONDS",
                       help="output drain grace after a process exits (default 2)")
    serve.add_argument("--shutdown-timeout", type=_seconds, default=DEFAULT_SHUTDOWN_TIMEOUT,
                       metavar="SECONDS", help="graceful shutdown watchdog (default 30)")

    run = commands.add_parser("exec", help="run a command on a server")
    run.usage_exit = ExecExit.FAILURE
    run.add_argument("--connect", metavar="ADDR",
                     help="server address (default: the user's socket)")
    mode = run.add_mutually_exclusive_group()
    mode.add_argument("-t", dest="pty", action="store_const", const=True, help="force a PTY")
    mode.add_argument("-T", dest="pty", action="store_const", const=False, help="force pipes")
    run.add_argument("--env", action="append", type=_env_pair, default=[], metavar="K=V")
    run.add_argument("--cwd", metavar="DIR")
    run.add_argument("--retries", type=int, default=0, metavar="N")
    run.add_argument("--json", action="store_true", help="JSON events on stdout, one per line")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- ARGV")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.subcommand == "serve":
        try:
            addresses = [parse_address(a) for a in args.listen] or [default_address()]
        except AddressError as exc:
            sys.stderr.write(f"ttyserve serve: {exc}\n")
            sys.exit(ServeExit.CONFIG)
        sys.exit(serve_main(ServeOptions(addresses, args.command, args.linger,
                                         args.shutdown_timeout)))
    try:
        address = parse_address(args.connect) if args.connect else default_address()
    except AddressError as exc:
        sys.stderr.write(f"ttyserve exec: {exc}\n")
        sys.exit(ExecExit.FAILURE)
    if args.retries < 0:
        sys.stderr.write("ttyserve exec: --retries must be >= 0\n")
        sys.exit(ExecExit.FAILURE)
    remote = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    sys.exit(exec_main(ExecOptions(address, remote, args.pty, dict(args.env), args.cwd,
                                   args.retries, args.json)))
