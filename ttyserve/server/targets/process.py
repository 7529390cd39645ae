"""A session's process on a target, as the session adapter sees any process (backends/base.py).

Its output is what the far side sent on the session's channel of the target's carrier
connection (link.py), held here until the session's pump takes it; taking it grants the
far side as much again, so this server holds at most `--target-window` bytes per session
beyond what its clients took, and a client that stops reading stops the far process. Its
exit is the far side's, exactly, and `wait` returns it only once the output before it was
taken: the session's linger then has nothing left to wait for.

A detachable session's far side is a detachable session too. When the carrier connection
drops, the process attaches to it again over a new one at the offsets it holds (section
10), within the session's detached timeout: its session sees a pause, nothing more.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import signal
from typing import TYPE_CHECKING, get_args

import anyio

from ...backends.base import ProcessSpec, Uncontained
from ...errors import ErrorCode, RequestError, SpawnError
from ...protocol.frames import FrameKind
from ...protocol.messages import (
    Attach,
    Attached,
    Eof,
    Error,
    Exit,
    Modes,
    Offsets,
    Open,
    Opened,
    Resize,
    Signal,
    SignalName,
)
from ...transport.readiness import Watch

if TYPE_CHECKING:
    from collections.abc import Callable

    from .hosts import TargetPlace
    from .link import TargetLink

log = logging.getLogger("ttyserve")

SIGNAL_NAMES = frozenset(get_args(SignalName))
RESUME_FIRST_WAIT = 0.1  # seconds before the second try to reach a target again; doubled
RESUME_LONGEST_WAIT = 5.0  # ...up to this
TARGET_LOST = "the connection to the target ended and its session could not be resumed"
CANCELLED = "ended by this server before it exited: its status on the target is not known"


class RemoteOutput:
    """One output stream of a process on a target: what came, until the pump takes it."""

    def __init__(self, process: RemoteProcess) -> None:
        self._process = process
        self._chunks: collections.deque[bytes] = collections.deque()
        self.size = 0
        self._eof = False
        self._waiter: anyio.Event | None = None

    @property
    def at_eof(self) -> bool:
        return self._eof and not self.size

    async def wait_readable(self) -> None:
        while not self.size and not self._eof:
            self._waiter = anyio.Event()
            await self._waiter.wait()

    def receive_nowait(self, limit: int) -> bytes:
        taken: list[bytes] = []
        size = 0
        chunks = self._chunks
        while chunks and size < limit:
            chunk = chunks.popleft()
            if size + len(chunk) > limit:
                chunks.appendleft(chunk[limit - size:])
                chunk = chunk[:limit - size]
            taken.append(chunk)
            size += len(chunk)
        self.size -= size
        if size:
            self._process.consumed(size)
        return taken[0] if len(taken) == 1 else b"".join(taken)

    def watch(self, callback: Callable[[], None]) -> Watch | None:
        return None  # (no descriptor: the pump waits in a task)

    def feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self.size += len(data)
        self._wake()

    def end(self) -> None:
        self._eof = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None:
            self._waiter.set()
            self._waiter = None


class RemoteProcess(Uncontained):
    """A process on a target, behind one channel of the target's carrier connection (a new
    channel, on a new connection, after each resume)."""

    def __init__(self, place: TargetPlace, spec: ProcessSpec) -> None:
        self.place = place
        self.spec = spec
        self.pid = 0
        self.stdout = RemoteOutput(self)
        self.stderr: RemoteOutput | None = None if spec.pty else RemoteOutput(self)
        self.status: Exit | None = None  # once the exit came and the output before it was taken
        self.far_session: str | None = None  # the far side's id of a detachable session
        self.offsets = {FrameKind.STDOUT: 0, FrameKind.STDERR: 0}  # bytes received
        self.link: TargetLink | None = None
        self.channel = 0
        self._answer: anyio.Event | None = None  # an open or attach waits for its answer
        self._refusal: Error | None = None
        self._far_exit: Exit | None = None
        self._done = anyio.Event()  # the status is known
        self._changed: anyio.Event | None = None  # stdin waits for credit or a new channel
        self._size = (spec.rows, spec.cols)
        self._eof_pending = False
        self.ended = False  # the exit came, or it was given up
        # Section 14: the far terminal's flags, as of the output taken, and the changes the
        # far side told that hold from output not taken yet (offset, flags).
        self._flags: tuple[bool, bool] | None = None
        self._flag_changes: collections.deque[tuple[int, tuple[bool, bool]]] = (
            collections.deque())
        self._accepted = False  # the last open or attach was answered `opened`/`attached`
        self._signal: Signal | None = None  # sent once a resume has attached again
        self._carried = 0  # output of an earlier channel still held: no credit for it

    # --- the session adapter's side ----------------------------------------------------

    async def start(self) -> None:
        """Open the session on the target: RequestError (target_unreachable, or the far
        side's refusal), SpawnError for a spawn the far side could not make."""
        spec = self.spec
        request = Open(argv=spec.argv, pty=spec.pty, rows=spec.rows, cols=spec.cols,
                       term=spec.term, env=spec.env, cwd=spec.cwd, detachable=spec.detachable,
                       modes=spec.pty)
        link = await self.place.connect()
        if await self._ask(link, request):
            if link.over and not self.ended:  # (lost right after `opened`: resumed, or
                self.lost()  # ended, as any)
            return
        refusal = self._refusal
        if refusal is None:  # never sent again: the far side may have started it
            raise self.place.unreachable("its carrier connection ended before the session "
                                         "was opened; it may have started there")
        if refusal.code == ErrorCode.SPAWN_FAILED:
            raise SpawnError(refusal.errno or 0, refusal.message)
        raise RequestError(refusal.code, f"target {self.place.name}: {refusal.message}",
                           errno=refusal.errno, retry_after_ms=refusal.retry_after_ms,
                           retriable=refusal.retriable)

    async def _ask(self, link: TargetLink, request: Open | Attach) -> bool:
        """Send an open or an attach on a new channel of ``link`` and wait for its answer:
        whether it was opened (else `_refusal` says why, or is None: the link ended)."""
        self._answer, self._refusal, self._accepted = anyio.Event(), None, False
        self.link, self.channel = link, link.begin(self, request)
        await self._answer.wait()
        self._answer = None
        return self._accepted  # (its exit may have come with it: a command over at once)

    def abandon(self) -> None:
        """The open was given up (its client went): the far side cancels it, if it began."""
        link = self.link
        if link is not None and not link.over and link.core.live(self.channel):
            link.send(link.core.cancel(self.channel))
        self.ended = True
        self.release()

    def write_nowait(self, data: bytes) -> int:
        if self.ended:
            raise anyio.BrokenResourceError("the session on the target has ended")
        return 0

    async def send_stdin(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self.ended:
                raise anyio.BrokenResourceError("the session on the target has ended")
            link = self.link
            limit = link.core.stdin_limit(self.channel) if link is not None and (
                not link.over and self._answer is None) else 0
            if not limit:
                self._changed = anyio.Event()
                await self._changed.wait()
                continue
            assert link is not None
            link.send(link.core.stdin(self.channel, bytes(view[:limit])))
            view = view[limit:]
            await link.outbox.wait_for_room()

    async def send_eof(self) -> None:
        if self.ended:
            raise anyio.BrokenResourceError("the session on the target has ended")
        if not self._control(Eof()):
            self._eof_pending = True

    def resize(self, rows: int, cols: int) -> None:
        self._size = (rows, cols)
        self._control(Resize(rows=rows, cols=cols))

    def send_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name.removeprefix("SIG")
        if name in SIGNAL_NAMES:
            self._signal_far(Signal(name=name))  # type: ignore[arg-type]

    def hang_up(self) -> bool:
        if self.ended:
            return False
        self._signal_far(Signal(name="HUP"))
        return True

    def kill(self) -> None:
        self._signal_far(Signal(name="KILL"))

    def _signal_far(self, message: Signal) -> None:
        """Sent now, or (the carrier being replaced) once the session is attached again."""
        if not self.ended and not self._control(message):
            self._signal = message

    def watch_exit(self, reaped: Callable[[Exit], None]) -> Watch | None:
        return None

    def terminal_flags(self) -> tuple[bool, bool] | None:
        """The far terminal's flags as of the output the session took (all it was told, once
        none is left to take: a change with no output after it)."""
        self._settle_flags()
        return self._flags

    def _settle_flags(self) -> None:
        """The changes that hold from output already taken apply (what is left: changes for
        the output held, at most a window's)."""
        changes, taken = self._flag_changes, self.offsets[FrameKind.STDOUT] - self.stdout.size
        while changes and (changes[0][0] < taken or not self.stdout.size):
            self._flags = changes.popleft()[1]

    async def wait(self) -> Exit:
        await self._done.wait()
        assert self.status is not None
        return self.status

    async def aclose(self) -> None:
        """Not ended: its far side is cancelled (the far server ends it); let go."""
        if not self.ended:
            link = self.link
            if link is not None and not link.over and link.core.live(self.channel):
                link.send(link.core.cancel(self.channel))
            self._finish(Exit(code=-1, error=CANCELLED))
        self.release()

    def release(self) -> None:
        link, self.link = self.link, None
        if link is not None:
            link.forget(self.channel)
        self._answered()  # (an attach of a resume under way learns so)
        self.place.session_ended(self)

    # --- the link's side -------------------------------------------------------------

    def opened(self, opened: Opened) -> None:
        self.pid = opened.pid
        self.far_session = opened.session
        if opened.argv:  # what runs there (the far side's default when none was asked)
            self.spec = dataclasses.replace(self.spec, argv=opened.argv)
        self._accepted = True
        self._answered()

    def attached(self, attached: Attached) -> None:
        """Attached again after a resume: the output goes on where it was."""
        far = attached.offsets
        if far is not None and (far.stdout, far.stderr) != (
                self.offsets[FrameKind.STDOUT], self.offsets[FrameKind.STDERR]):
            log.warning("target %s: session %s resumed at %s, not where it was (%s)",
                        self.place.name, self.far_session, far, self.offsets)
        self._accepted = True
        self._carried = self.stdout.size + (self.stderr.size if self.stderr is not None else 0)
        self._answered()

    def refused(self, error: Error) -> None:
        self._refusal = error
        self._answered()

    def output(self, kind: FrameKind, data: bytes) -> None:
        self.offsets[kind] += len(data)
        source = self.stdout if kind is FrameKind.STDOUT or self.stderr is None else self.stderr
        source.feed(data)

    def exited(self, status: Exit) -> None:
        if self.far_session is not None and self.link is not None:
            self.link.send(self.link.core.release(self.far_session))  # (read: forget it)
        self._finish(status)

    def credit(self) -> None:
        self._wake()

    def modes(self, modes: Modes) -> None:
        """The far side told its terminal's state, holding from its STDOUT ``offset``."""
        self._flag_changes.append((modes.offset, (modes.echo, modes.canonical)))
        self._settle_flags()

    def lost(self) -> None:
        """The carrier connection ended under the session: resumed over a new one where its
        far side is detachable, else ended."""
        if self._answer is not None:  # an open or attach waited: it learns so
            self._answered()
            return
        if self.ended:
            return
        if self.far_session is None:
            self._finish(Exit(code=-1, error="the connection to the target ended: its "
                                              "status there is not known"))
            return
        self.place.start_soon(self._resume)

    def consumed(self, size: int) -> None:
        """The pump took ``size`` bytes: the far side may send as much again (not for what
        came on an earlier channel, whose credit went with it)."""
        carried = min(size, self._carried)
        self._carried -= carried
        size -= carried
        link = self.link
        if size and link is not None and not link.over and not self.ended and (
                frame := link.core.output_consumed(self.channel, size)):
            link.send(frame)
        self._settle_flags()
        self._check_taken()

    # --- inside ------------------------------------------------------------------------

    async def _resume(self) -> None:
        deadline = anyio.current_time() + (self.spec.detached_timeout or 0)
        wait = RESUME_FIRST_WAIT
        while not self.ended:
            try:
                link = await self.place.connect()
            except RequestError as exc:
                if anyio.current_time() + wait > deadline:
                    log.warning("target %s: session %s: %s", self.place.name,
                                self.far_session, exc.message)
                    self._finish(Exit(code=-1, error=TARGET_LOST))
                    return
                await anyio.sleep(wait)
                wait = min(wait * 2, RESUME_LONGEST_WAIT)
                continue
            if self.ended:  # (given up meanwhile: aclose, a kill)
                return
            assert self.far_session is not None
            rows, cols = self._size
            request = Attach(session=self.far_session, rows=rows, cols=cols, steal=True,
                             offsets=Offsets(stdout=self.offsets[FrameKind.STDOUT],
                                             stderr=self.offsets[FrameKind.STDERR]),
                             modes=self.spec.pty)
            if await self._ask(link, request):
                if self._eof_pending:
                    self._eof_pending = not self._control(Eof())
                if (pending := self._signal) is not None:
                    self._signal = None
                    self._control(pending)
                if link.over and not self.ended:
                    self.lost()
                self._wake()
                return
            if self.ended:
                if link.core.live(self.channel):
                    link.send(link.core.cancel(self.channel))
                return
            if self._refusal is not None:
                log.warning("target %s: session %s could not be attached again: %s",
                            self.place.name, self.far_session, self._refusal.message)
                self._finish(Exit(code=-1, error=TARGET_LOST))
                return

    def _control(self, message: Resize | Signal | Eof) -> bool:
        """Send a control message on the live channel; whether it went."""
        link = self.link
        if link is None or link.over or self._answer is not None or not link.core.live(
                self.channel):
            return False
        link.send(link.core.control(self.channel, message))
        return True

    def _answered(self) -> None:
        if self._answer is not None:
            self._answer.set()
        self._wake()

    def _finish(self, status: Exit) -> None:
        if self.ended:
            return
        self.ended = True
        self._far_exit = status
        self._answered()
        self.stdout.end()
        if self.stderr is not None:
            self.stderr.end()
        self._check_taken()
        self._wake()

    def _check_taken(self) -> None:
        """The exit came and its output was taken: the status is known."""
        if self._far_exit is not None and self.status is None and not self.stdout.size and (
                self.stderr is None or not self.stderr.size):
            self.status = self._far_exit
            self._done.set()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None
