"""Command line: `ttyserve serve`, `exec`, `attach`, `sessions`, `share`, `unshare`, `kill`,
`targets` and `recording`. The only place that calls sys.exit."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Sequence

from ..addresses import Address, default_address, parse_address
from ..credentials import read_token
from ..defaults import (
    DEFAULT_HEARTBEAT,
    DEFAULT_PARALLEL,
    DEFAULT_REMOTE_COMMAND,
    MAX_HEARTBEAT,
)
from ..errors import AddressError, ConfigError, UsageError
from ..exitcodes import ExecExit, RecordingExit, ServeExit
from ..version import __version__
from .terminal import DEFAULT_DETACH_KEY, parse_key

DESCRIPTION = """\
Run processes on this host under a PTY or pipes and serve them to remote clients
(serve), run a command on such a server as if it ran here (exec), reattach to a
session that outlived its client (attach), list sessions (sessions) or a
door's targets (targets), let someone watch one (share, unshare), end one
(kill), or convert a recording for older players (recording).
`ttyserve COMMAND --help` for details."""


class _Parser(argparse.ArgumentParser):
    """argparse that exits with the subcommand's own usage code."""

    usage_exit: int = ServeExit.USAGE
    subcommands: dict[str, _Parser]

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(self.usage_exit)


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _via(text: str) -> str:
    return "via:" + text


def _positive(text: str) -> int:
    value = _non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _heartbeat(text: str) -> int:
    value = _positive(text)
    if value > MAX_HEARTBEAT:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_HEARTBEAT}")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return value


@functools.cache
def build_parser(command: str | None = None) -> _Parser:
    """The whole parser; given the ``command`` being run, only that command's flags (the
    others' help lines stay), so that `exec` never imports what `serve` needs."""
    parser = _Parser(prog="ttyserve", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"ttyserve {__version__}")
    commands = parser.add_subparsers(dest="subcommand", required=True, parser_class=_Parser,
                                     title="commands", metavar="COMMAND")
    parser.subcommands = commands.choices

    serve = commands.add_parser("serve", help="run the server")
    if command in (None, "serve"):
        from ..server import config

        config.add_arguments(serve)

    run = commands.add_parser(
        "exec", help="run a command on a server, or on many", description=(
            "Run a command on a server as if it ran here: its output, its exit status, your "
            "signals passed on. In pipe mode with stdin not a terminal (a script's loop), "
            "exec first hands itself to a warm server of yours, which has everything "
            "imported already, and starts one in the background when none answers: one "
            "process per user, installation and confinement, in the runtime directory "
            "(ttyserve-warm-*.sock), ending after 5 minutes without a command. "
            "TTYSERVE_WARM=0 turns it off."))
    run.usage_exit = ExecExit.FAILURE
    _client_arguments(run, many=True)
    run.add_argument("--via", dest="targets", action="append", type=_via, metavar="'CMD ...'",
                     help="reach the far side through this carrier (kubectl exec -i POD --, "
                          "...): short for --connect 'via:CMD ...' (repeatable)")
    run.add_argument("--hosts", metavar="FILE",
                     help="more targets, one address per line (blank lines and lines "
                          "starting with # are ignored)")
    run.add_argument("--target", dest="on", action="append", type=_target, metavar="NAME",
                     help="run it on this target of the door (serve --targets) that --connect "
                          "names; a glob ('web-*') or LABEL=VALUE runs it on every target "
                          "that matches (repeatable)")
    run.add_argument("--parallel", type=_positive, default=DEFAULT_PARALLEL, metavar="N",
                     help=f"with many targets, run on at most N at once "
                          f"(default {DEFAULT_PARALLEL})")
    run.add_argument("--detachable", action="store_true",
                     help="the session outlives this client: detach with the detach key, "
                          "or by losing the connection; reattach with `ttyserve attach ID`")
    mode = run.add_mutually_exclusive_group()
    mode.add_argument("-t", dest="pty", action="store_const", const=True, help="force a PTY")
    mode.add_argument("-T", dest="pty", action="store_const", const=False, help="force pipes")
    run.add_argument("--env", action="append", type=_env_pair, default=[], metavar="K=V",
                     help="set K to V in the remote command's environment (repeatable)")
    run.add_argument("--cwd", metavar="DIR",
                     help="remote working directory (default: the server's)")
    run.add_argument("--retries", type=_non_negative, default=0, metavar="N",
                     help="retry up to N times a failure that may pass (refused, busy, ...), "
                          "only before the command starts (default 0)")
    run.add_argument("--json", action="store_true", help="JSON events on stdout, one per line")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- ARGV",
                     help="the command and its arguments (default: the server's command)")

    attach = commands.add_parser("attach", help="reattach to a detachable session")
    attach.usage_exit = ExecExit.FAILURE
    _client_arguments(attach)
    attach.add_argument("--steal", action="store_true",
                        help="take the session over from the client attached to it")
    attach.add_argument("--observe", action="store_true",
                        help="watch read-only: keys typed are not sent (the detach key and "
                             "Ctrl-C leave), the writer is not disturbed")
    attach.add_argument("--grant", metavar="GRANT", default=os.environ.get("TTYSERVE_GRANT"),
                        help="come in with a grant (ttyserve share) instead of the token: "
                             "attach in the grant's role (default: $TTYSERVE_GRANT, which "
                             "keeps it out of the process list)")
    attach.add_argument("--json", action="store_true", help="JSON events on stdout, one per line")
    attach.add_argument("session", metavar="ID", help="the session's id (exec and sessions "
                        "--live show it)")

    share = commands.add_parser(
        "share", help="let someone without the token watch (or write to) one session",
        description="Make a grant for one of your sessions and print it (with a ws: or wss: "
                    "--connect, also the page's link).")
    share.usage_exit = ExecExit.FAILURE
    _connect_arguments(share)
    share.add_argument("--writer", action="store_true",
                       help="the grant lets its holder type too (default: watch only)")
    share.add_argument("--ttl", type=_duration, metavar="DURATION",
                       help="how long the grant lasts: 90, 30m, 1h, 2d (default: 1h, or the "
                            "server's --max-share-ttl if that is less)")
    share.add_argument("--json", action="store_true",
                       help="the grant as one JSON object (with its id, role, expiry)")
    share.add_argument("session", metavar="ID", help="the session's id")
    kill = commands.add_parser(
        "kill", help="end one of your sessions, attached or not (or send it a signal)",
        description="Cancel a session (its process tree is hung up, killed after a second and "
                    "reaped; the journal says cancelled), or with --signal send its process "
                    "that signal: the session then ends as its process does. A client "
                    "attached to it is detached (\"another client took the session over\"). "
                    "Exit 0, or 255 with a line (an unknown id: no_such_session).")
    kill.usage_exit = ExecExit.FAILURE
    _connect_arguments(kill)
    kill.add_argument("--signal", type=_signal_name, metavar="NAME",
                      help="send this signal instead of cancelling (INT, TERM, KILL, HUP, ...: "
                           "a name without SIG)")
    kill.add_argument("session", metavar="ID", help="the session's id")
    unshare = commands.add_parser("unshare", help="revoke a grant: its viewers are detached")
    unshare.usage_exit = ExecExit.FAILURE
    _connect_arguments(unshare)
    unshare.add_argument("grant", metavar="GRANT",
                         help="the grant, or its id (gid-..., as sessions --live shows)")

    sessions = commands.add_parser(
        "sessions", help="list recent sessions from a journal, or a server's live ones")
    sessions.add_argument("--live", action="store_true",
                          help="the server's detachable sessions for the caller, running, "
                               "detached or ended (instead of a journal's records)")
    _connect_arguments(sessions)  # (with --live)
    sessions.add_argument("--journal", metavar="FILE",
                          help="journal file (default: $TTYSERVE_JOURNAL)")
    sessions.add_argument("--json", action="store_true", help="one JSON object per session")
    sessions.add_argument("--limit", type=_non_negative, default=50, metavar="N",
                          help="most recent N sessions (default 50; 0 for all)")
    targets = commands.add_parser(
        "targets", help="list the targets of a door that you may open",
        description="Ask the door (serve --targets) which targets you may open, with their "
                    "labels and state (connected, idle, unreachable).")
    targets.usage_exit = ExecExit.FAILURE
    _connect_arguments(targets)
    targets.add_argument("--json", action="store_true",
                         help='one JSON object, {"targets": [...]}, as the door says it')
    _recording_arguments(commands.add_parser(
        "recording", help="convert a recording (serve --record) for older players"))
    return parser


def _recording_arguments(recording: _Parser) -> None:
    """`recording convert`: the one thing done to a recording after the fact."""
    recording.usage_exit = RecordingExit.NOT_CONVERTED
    verbs = recording.add_subparsers(dest="verb", required=True, parser_class=_Parser,
                                     title="commands", metavar="COMMAND",
                                     help="what to do with a recording")
    recording.subcommands = verbs.choices
    convert = verbs.add_parser(
        "convert", help="a recording as asciicast v2, for asciinema 2.x",
        description="Write a recording of serve --record (asciicast v3) as asciicast v2, "
                    "which the asciinema 2.x that distributions ship plays (it refuses "
                    "v3): times since the start instead of intervals, the header's terminal "
                    "as width, height and env.TERM, the exit as a last marker 'exit CODE'. "
                    "Exit 0, or 2 with a line naming what is wrong (FILE not a recording, "
                    "OUT not writable); OUT is then left as it was.")
    convert.usage_exit = RecordingExit.NOT_CONVERTED
    convert.add_argument("--to", required=True, choices=["v2"],
                         help="the format to write: v2 (asciicast v2)")
    convert.add_argument("-o", "--output", metavar="OUT",
                         help="write it to OUT, replaced only once all is converted "
                              "(default: stdout)")
    convert.add_argument("file", metavar="FILE", help="the recording (DIR/ID.cast)")


def _connect_arguments(parser: argparse.ArgumentParser) -> None:
    """Where and with what a command that only asks the server something connects."""
    parser.add_argument("--connect", metavar="ADDR",
                        help="server address (default: $TTYSERVE_CONNECT, else the user's "
                             "socket)")
    parser.add_argument("--token-file", metavar="FILE",
                        help="file (mode 600) holding the server's token (without it: the "
                             "token itself in $TTYSERVE_TOKEN, if set)")
    parser.add_argument("--tls-ca", metavar="FILE",
                        help="CA certificates that sign the server's (default: the system's)")


def _signal_name(text: str) -> str:
    from .kill import SIGNALS

    name = text.upper().removeprefix("SIG")
    if name not in SIGNALS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(SIGNALS)}")
    return name


def _target(text: str) -> str:
    from .targets import check

    try:
        return check(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _duration(text: str) -> int:
    from .share import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _client_arguments(parser: argparse.ArgumentParser, many: bool = False) -> None:
    """What every command that connects takes: where (and, for `exec`, where all), the
    token, the CA, the far side's command, the detach key."""
    if many:
        parser.add_argument("--connect", dest="targets", action="append", metavar="ADDR",
                            help="server address: unix:PATH, tcp:HOST:PORT, tls:HOST:PORT, "
                                 "ws:HOST:PORT, wss:HOST:PORT, ssh://[USER@]HOST[:PORT], "
                                 "via:CMD ... (default: "
                                 "$TTYSERVE_CONNECT, else the user's socket); repeat it to "
                                 "run on many targets")
    else:
        parser.add_argument("--connect", metavar="ADDR",
                            help="server address (default: $TTYSERVE_CONNECT, else the "
                                 "user's socket)")
    parser.add_argument("--remote-command", default=DEFAULT_REMOTE_COMMAND, metavar="PATH",
                        help="what ssh:// and via: carriers run on the far side "
                             f"(default {DEFAULT_REMOTE_COMMAND})")
    parser.add_argument("--token-file", metavar="FILE",
                        help="file (mode 600) holding the server's token (without it: the "
                             "token itself in $TTYSERVE_TOKEN, if set)")
    parser.add_argument("--tls-ca", metavar="FILE",
                        help="CA certificates that sign the server's (default: the system's)")
    if parser.prog.endswith(("exec", "attach")):
        parser.add_argument("--resume", type=_positive, metavar="SECONDS",
                            help="when the connection is lost, come back for up to SECONDS "
                                 "and go on where the output stopped (the session is "
                                 "detachable, and hung up once without a client that long)")
        parser.add_argument("--heartbeat", type=_heartbeat, metavar="SECONDS",
                            help="speak at least every SECONDS, and count the server lost "
                                 f"after 3 x SECONDS of silence (default with --resume: "
                                 f"{DEFAULT_HEARTBEAT})")
        parser.add_argument("--detach-key", metavar="KEYS", type=_detach_key,
                            default=_detach_key(DEFAULT_DETACH_KEY),
                            help="keys that detach a detachable session at a terminal, in "
                                 "caret notation (default ^\\d: Ctrl-\\ then d; none: never)")


def _detach_key(text: str) -> bytes | None:
    if text == "none":
        return None
    try:
        return parse_key(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _connection(args: argparse.Namespace, command: str) -> tuple[Address, str | None] | None:
    """The address and token a client command was given; None (said on stderr) if unusable."""
    connect = args.connect or os.environ.get("TTYSERVE_CONNECT")
    try:
        address = parse_address(connect) if connect else default_address()
        return address, read_token(args.token_file)
    except (AddressError, ConfigError, OSError) as exc:  # OSError: a cwd that is gone
        sys.stderr.write(f"ttyserve {command}: {exc}\n")
        return None


def _targets(args: argparse.Namespace) -> list[tuple[str, Address]]:
    """`exec`'s targets, each as given with its address: --connect and --via in order, then
    --hosts FILE; the first of duplicates only. Raises AddressError or ConfigError."""
    given: list[tuple[str, str]] = [(text, "") for text in args.targets or []]
    if args.hosts:
        try:
            with open(args.hosts, encoding="utf-8") as file:
                lines = file.read().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--hosts {args.hosts}: {getattr(exc, 'strerror', None) or exc}"
                              ) from exc
        given += [(line.strip(), f"{args.hosts}:{number}: ")
                  for number, line in enumerate(lines, 1)
                  if line.strip() and not line.strip().startswith("#")]
        if not any(where for _, where in given):
            raise ConfigError(f"--hosts {args.hosts}: no targets in it")
    if not given:
        connect = os.environ.get("TTYSERVE_CONNECT")
        return [(connect, parse_address(connect))] if connect else [
            (str(default_address()), default_address())]
    targets: dict[str, Address] = {}
    for text, where in given:
        if text not in targets:
            try:
                targets[text] = parse_address(text)
            except AddressError as exc:
                raise AddressError(f"{where}{exc}") from None
    return list(targets.items())


def _serve(args: argparse.Namespace) -> int:
    from ..server import config
    from .serve import serve_main

    try:
        settings = config.load(args)
    except UsageError as exc:
        sys.stderr.write(f"ttyserve serve: {exc}\n")
        return ServeExit.USAGE
    except ConfigError as exc:
        sys.stderr.write(f"ttyserve serve: {exc}\n")
        return ServeExit.CONFIG
    if settings.persist:
        from .persist import persist_main

        return persist_main()
    return serve_main(settings)


def _exec(args: argparse.Namespace) -> int:
    from .exec_report import ExecOptions
    from .targets import one_session

    try:
        targets = _targets(args)
        token = read_token(args.token_file)
    except (AddressError, ConfigError, OSError) as exc:  # OSError: a cwd that is gone
        sys.stderr.write(f"ttyserve exec: {exc}\n")
        return ExecExit.FAILURE
    if args.on and len(targets) > 1:
        sys.stderr.write(f"ttyserve exec: --target runs through one door: give one "
                         f"--connect, not {len(targets)} addresses\n")
        return ExecExit.FAILURE
    # A selector (a glob, LABEL=VALUE) fans out, even to one target; one name is one session.
    fans_out = not one_session(args.on) if args.on else len(targets) > 1
    remote = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    options = ExecOptions(targets[0][1], remote, args.pty, dict(args.env), args.cwd,
                          args.retries, args.json, token, args.tls_ca,
                          detachable=args.detachable, detach_key=args.detach_key,
                          remote_command=args.remote_command, target=targets[0][0],
                          resume=args.resume, heartbeat=args.heartbeat,
                          on_target=args.on[0] if args.on and not fans_out else None)
    if not fans_out:
        from . import exec_direct

        if exec_direct.eligible(options):  # no event loop to import: the fast start
            return exec_direct.exec_direct(options)
        from .exec import exec_main

        return exec_main(options)
    from .exec_many import fanout_main

    for flag, given in (("-t", args.pty), ("--detachable", args.detachable),
                        ("--resume", args.resume)):
        if given:
            many = " ".join(f"--target {t}" for t in args.on) if args.on else len(targets)
            sys.stderr.write(f"ttyserve exec: {flag} works with one target, not {many}\n")
            return ExecExit.FAILURE
    if not args.on:
        return fanout_main(options, [text for text, _ in targets], args.parallel)
    from .exec_report import ExecFailure, Output
    from .targets import choose

    try:
        chosen = choose(options, args.on)
    except ExecFailure as exc:
        return exc.said(Output(options.json))
    return fanout_main(options, chosen, args.parallel)


def _attach(args: argparse.Namespace) -> int:
    from .exec import exec_main
    from .exec_report import ExecOptions, said_by

    said_by("attach")
    reached = _connection(args, "attach")
    if reached is None:
        return ExecExit.FAILURE
    address, token = reached
    return exec_main(ExecOptions(address, [], json=args.json, token=token, tls_ca=args.tls_ca,
                                 detach_key=args.detach_key, attach=args.session,
                                 steal=args.steal, remote_command=args.remote_command,
                                 target=args.connect or "", resume=args.resume,
                                 heartbeat=args.heartbeat, observe=args.observe,
                                 grant=args.grant))


def _share(args: argparse.Namespace) -> int:
    from .share import share_main

    reached = _connection(args, "share")
    if reached is None:
        return ExecExit.FAILURE
    return share_main(reached[0], reached[1], args.tls_ca, args.session, args.writer,
                      args.ttl, args.json)


def _unshare(args: argparse.Namespace) -> int:
    from .share import unshare_main

    reached = _connection(args, "unshare")
    if reached is None:
        return ExecExit.FAILURE
    return unshare_main(reached[0], reached[1], args.tls_ca, args.grant)


def _kill(args: argparse.Namespace) -> int:
    from .kill import kill_main

    reached = _connection(args, "kill")
    if reached is None:
        return ExecExit.FAILURE
    return kill_main(reached[0], reached[1], args.tls_ca, args.session, args.signal)


def _sessions(args: argparse.Namespace) -> int:
    from .sessions import live_main, sessions_main

    if args.live:
        reached = _connection(args, "sessions")
        if reached is None:
            return ExecExit.FAILURE
        return live_main(reached[0], reached[1], args.tls_ca, args.json)
    path = args.journal or os.environ.get("TTYSERVE_JOURNAL")
    if not path:
        sys.stderr.write("ttyserve sessions: no journal: give --journal FILE or set "
                         "TTYSERVE_JOURNAL\n")
        return ServeExit.USAGE
    return sessions_main(path, args.json, args.limit)


def _list_targets(args: argparse.Namespace) -> int:
    from .targets import targets_main

    reached = _connection(args, "targets")
    if reached is None:
        return ExecExit.FAILURE
    return targets_main(reached[0], reached[1], args.tls_ca, args.json)


def _recording(args: argparse.Namespace) -> int:
    from .recording import convert_main

    return convert_main(args.file, args.output)


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse ``argv``; a usage error exits with its subcommand's code (`exec`: 255)."""
    words = sys.argv[1:] if argv is None else list(argv)
    command = next((word for word in words if not word.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    args, extras = parser.parse_known_args(words)
    if extras:
        # argparse leaves a subcommand's unknown flags to the top-level parser, which
        # would exit 2: the subcommand reports them, with its own usage and exit code.
        command_parser = parser.subcommands[args.subcommand]
        if verb := getattr(args, "verb", None):  # `recording convert`: its own usage
            command_parser = command_parser.subcommands[verb]
        command_parser.error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_arguments(argv)
    handlers = {"serve": _serve, "exec": _exec, "attach": _attach, "sessions": _sessions,
                "share": _share, "unshare": _unshare, "kill": _kill, "targets": _list_targets,
                "recording": _recording}
    sys.exit(handlers[args.subcommand](args))


COMMANDS = ("serve", "exec", "attach", "sessions", "share", "unshare", "kill", "targets",
            "recording")
