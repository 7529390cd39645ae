"""Command line: `ttyserve serve`, `exec` and `sessions`. The only place that calls sys.exit."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from . import __version__, config
from .addresses import default_address, parse_address
from .errors import AddressError, ConfigError, UsageError
from .exitcodes import ExecExit, ServeExit


class _Parser(argparse.ArgumentParser):
    """argparse that exits with the subcommand's own usage code."""

    usage_exit: int = ServeExit.USAGE

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(self.usage_exit)


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ttyserve", description=__doc__)
    parser.add_argument("--version", action="version", version=f"ttyserve {__version__}")
    commands = parser.add_subparsers(dest="subcommand", required=True, parser_class=_Parser)

    serve = commands.add_parser("serve", help="run the server")
    config.add_arguments(serve)

    run = commands.add_parser("exec", help="run a command on a server")
    run.usage_exit = ExecExit.FAILURE
    run.add_argument("--connect", metavar="ADDR",
                     help="server address (default: $TTYSERVE_CONNECT, else the user's socket)")
    run.add_argument("--token-file", metavar="FILE",
                     help="file holding the server's token (default: $TTYSERVE_TOKEN)")
    run.add_argument("--tls-ca", metavar="FILE",
                     help="CA certificates that sign the server's (default: the system's)")
    mode = run.add_mutually_exclusive_group()
    mode.add_argument("-t", dest="pty", action="store_const", const=True, help="force a PTY")
    mode.add_argument("-T", dest="pty", action="store_const", const=False, help="force pipes")
    run.add_argument("--env", action="append", type=_env_pair, default=[], metavar="K=V")
    run.add_argument("--cwd", metavar="DIR")
    run.add_argument("--retries", type=_non_negative, default=0, metavar="N")
    run.add_argument("--json", action="store_true", help="JSON events on stdout, one per line")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- ARGV")

    sessions = commands.add_parser("sessions", help="list recent sessions from a journal")
    sessions.add_argument("--journal", metavar="FILE",
                          help="journal file (default: $TTYSERVE_JOURNAL)")
    sessions.add_argument("--json", action="store_true", help="one JSON object per session")
    sessions.add_argument("--limit", type=_non_negative, default=50, metavar="N",
                          help="most recent N sessions (default 50; 0 for all)")
    return parser


def _serve(args: argparse.Namespace) -> int:
    from .serve_cmd import serve_main

    try:
        settings = config.load(args)
    except UsageError as exc:
        sys.stderr.write(f"ttyserve serve: {exc}\n")
        return ServeExit.USAGE
    except ConfigError as exc:
        sys.stderr.write(f"ttyserve serve: {exc}\n")
        return ServeExit.CONFIG
    return serve_main(settings)


def _exec(args: argparse.Namespace) -> int:
    from .exec_cmd import ExecOptions, exec_main, read_client_token

    connect = args.connect or os.environ.get("TTYSERVE_CONNECT")
    try:
        address = parse_address(connect) if connect else default_address()
        token = read_client_token(args.token_file)
    except (AddressError, OSError, ValueError) as exc:
        sys.stderr.write(f"ttyserve exec: {exc}\n")
        return ExecExit.FAILURE
    remote = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    return exec_main(ExecOptions(address, remote, args.pty, dict(args.env), args.cwd,
                                 args.retries, args.json, token, args.tls_ca))


def _sessions(args: argparse.Namespace) -> int:
    from .sessions_cmd import sessions_main

    path = args.journal or os.environ.get("TTYSERVE_JOURNAL")
    if not path:
        sys.stderr.write("ttyserve sessions: no journal: give --journal FILE or set "
                         "TTYSERVE_JOURNAL\n")
        return ServeExit.USAGE
    return sessions_main(path, args.json, args.limit)


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    handlers = {"serve": _serve, "exec": _exec, "sessions": _sessions}
    sys.exit(handlers[args.subcommand](args))
