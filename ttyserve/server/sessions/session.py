"""A session: one process the server runs, from spawn until its exit status is sent.

A session belongs to the server's registry, not to a connection: a connection
attaches a channel to it (its sink), and the session writes its output there.
Its life (life.py, as data): the process is reaped (its pidfd's readiness), its
output read to end-of-file or until the linger grace runs out, what it left in its
cgroup dealt with, and only then is the exit offered, after every output frame.
Here are its drivers, which feed the life events and carry out what it answers:
the loop's readiness callbacks alone where it has them for all of it (`start`),
else one task (`run`). The output is read by the pumps
(pump.py); the input goes through the stdin queue (stdin.py). Ending the
session (`cancel`, `hang_up`) is the cancel path: the process group is hung
up, killed after a grace, reaped, and nothing more is sent.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from ...backends.base import ProcessHandle, ProcessSpec
from ...defaults import DEFAULT_DETACHED_TIMEOUT, DEFAULT_LINGER, OUTPUT_CHUNK
from ...protocol.frames import FrameKind
from ...protocol.messages import INPUT, Exit, Message, Resize, Signal
from ...protocol.terminal_modes import TerminalModes
from ...transport.readiness import Watch
from ..journal import Reason, now_rfc3339
from .life import Action, Event, Life, Phase
from .pump import OutputPump
from .scrollback import Scrollback
from .sinks import LOST, Sink, Tap
from .stdin import StartTask, StdinQueue
from .streams import SessionStreams
from .terminal_state import TerminalState
from .typing_first import Typing

if TYPE_CHECKING:  # (a channel that watches: above the session)
    from ..channels.attachment import SessionChannel
    from ..channels.observer import Observer

Ended = Callable[["ServerSession", Exit | None], None]


class ServerSession:
    """One process the server runs, and what outlives any one connection to it."""

    __slots__ = (  # (a dict would be 1.5 KiB of each session's memory)
        "__weakref__", "_ended", "_exit_watch", "_kill_leftovers", "_redrawn_at", "_scope",
        "_sink_gone", "_start_task", "_typed_at", "bytes_in", "bytes_out", "delivered_at",
        "detached_at", "detached_timeout", "fault", "feeder", "id", "key", "life", "modes",
        "observers", "on_delivered", "on_forget", "owner", "peer", "process", "released",
        "ring", "sink", "size", "spec", "started", "stdin", "streams", "taps", "terminal",
        "typing",
    )

    def __init__(self, session_id: str, process: ProcessHandle, spec: ProcessSpec,
                 peer: str, start_task: StartTask, *, linger: float = DEFAULT_LINGER,
                 owner: str = "", scrollback: int | None = None,
                 detached_timeout: float = DEFAULT_DETACHED_TIMEOUT,
                 kill_leftovers: bool = True, typing: Typing | None = None) -> None:
        self.id = session_id
        self.key: str | None = None  # its `open`'s idempotency_key (section 13)
        self.process = process
        self.spec = spec
        self.peer = peer  # for the journal and the logs
        self.owner = owner  # the principal that opened it: only it may list or attach it
        self.started = now_rfc3339()
        self.size = (spec.rows, spec.cols)  # the terminal's, as last set
        self.sink: Sink | None = None
        # Detachable sessions (section 9) keep a ring of their output, attached or not.
        self.ring = Scrollback(scrollback) if scrollback is not None else None
        # ...and a PTY's, the terminal modes its output set (for `attached.prologue`).
        self.modes = TerminalModes() if self.ring is not None and spec.pty else None
        self.terminal: TerminalState | None = None  # section 14, once a channel asks
        self.detached_at: float | None = None  # when it was last left without a sink
        self.detached_timeout = detached_timeout  # seconds it may stay so (section 10)
        self.life = Life()  # its phase, status, exit and end reason (life.py)
        self.delivered_at: float | None = None  # when its exit last went out (section 10)
        self.taps: list[Tap] = []  # a recording, say: sees all output
        self.observers: list[Observer] = []  # channels that watch it (section 11)
        self.feeder: SessionChannel | None = None  # an HTTP write whose input is queued
        self.on_delivered: Callable[[ServerSession], None] | None = None  # its exit went out
        self.on_forget: Callable[[ServerSession], None] | None = None  # its life let it go
        self.bytes_in = self.bytes_out = 0
        self.typing = typing  # the server's: while anyone types, others read small
        self._typed_at = 0.0  # when a keystroke last came in (PTY sessions)
        self.stdin = StdinQueue(process, self._stdin_consumed, start_task)
        self.fault: Exception | None = None  # what broke the session's own code
        self.streams = SessionStreams(self, process, linger)  # its output, pump by pump
        self._scope: anyio.CancelScope | None = None  # made when it runs
        self._sink_gone: anyio.Event | None = None  # made when an attach waits for a writer
        self._exit_watch: Watch | None = None  # the loop reaps the process (its pidfd)
        self._ended: Ended | None = None  # on callbacks alone: told once it is over
        self._start_task = start_task
        self._kill_leftovers = kill_leftovers  # at a normal end (--leftovers kill)
        self._redrawn_at = -math.inf  # when the program was last told to redraw
        self.released = False  # its process reaped and its descriptors closed

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def detachable(self) -> bool:
        return self.ring is not None

    @property
    def outlives_upgrade(self) -> bool:
        """Whether an upgrade in place hands it to the new code: a detachable session of this
        host, or one of a target that has ended (a target's running process lives on a
        carrier connection, which cannot be handed over)."""
        return self.detachable and (self.spec.target is None or self.released)

    @property
    def final(self) -> Exit | None:
        """Its exit, once its output is over and its tree dealt with."""
        return self.life.final

    @property
    def pending_exit(self) -> Exit | None:
        """Its exit, when no client has had it yet (kept for the next attach)."""
        return self.life.final if self.detachable and self.life.exit_ready else None

    # --- what the connection and the registry ask ---------------------------------

    def attach(self, sink: Sink) -> None:
        """Write to ``sink`` from now on (the registry has let go of any other first)."""
        self.sink = sink
        self.detached_at = None
        self.delivered_at = None  # an ended one: kept again once its exit goes out again
        self._act(self.life.step(Event.ATTACHED))  # (its exit: offered once the replay is over)
        self.sink_ready()

    def detach(self) -> None:
        """Go on without a sink: output only goes to the ring, and the process never waits.
        Input the server took and the process has not yet stays queued for it."""
        self.sink = None
        self.detached_at = time.monotonic()
        self._writer_gone()
        self.sink_ready()

    async def wait_writer_gone(self) -> None:
        """Return once the session has no writer (it let go, or the session ended)."""
        while self.sink is not None:
            if self._sink_gone is None:
                self._sink_gone = anyio.Event()
            await self._sink_gone.wait()

    def _writer_gone(self) -> None:
        if (gone := self._sink_gone) is not None:
            self._sink_gone = None
            gone.set()

    def sink_ready(self) -> None:
        """The sink takes more (credit, room, its replay ended) or changed: the pumps go on,
        and a ready exit goes out."""
        self.streams.resume()
        self._offer_exit()

    def add_observer(self, observer: Observer) -> None:
        """A channel watches from now on (its backlog taken from the ring); the writer is
        told how many watch, and an ended session's exit is the observer's to send."""
        self.observers.append(observer)
        self._tell_audience()
        if self.life.final is not None:
            observer.finish(self.life.final)

    def remove_observer(self, observer: Observer) -> None:
        if observer in self.observers:
            self.observers.remove(observer)
            self._tell_audience()

    def _tell_audience(self) -> None:
        if (sink := self.sink) is not None:
            sink.audience(len(self.observers))

    def cancel(self, reason: Reason = Reason.CANCELLED) -> None:
        """End the session now: kill and reap its processes, send nothing more."""
        self._act(self.life.end(reason))

    def ended_without_status(self) -> None:
        """Ended from outside (a cancel, a fault): no exit of its own. A writer still attached
        ends with exit -1 all the same; observers learn how it died (they saw it all)."""
        self._act(self.life.end(Reason.CANCELLED))  # (a fault in its task: ended all the same)
        if self.sink is not None:
            self.sink.lost()
            self.sink = None
            self._writer_gone()
        for observer in list(self.observers):
            observer.finish(self.process.status or LOST)

    def _end_now(self) -> None:
        """Cancelled, or a fault: its task's scope is cancelled; a session on callbacks alone
        tells the registry, which ends it (with no status)."""
        if self._scope is not None:
            self._scope.cancel()
        elif (ended := self._ended) is not None:
            self._ended = None
            ended(self, None)

    def cancel_scope(self) -> anyio.CancelScope:
        """The scope the session's task runs in: cancelling it is the cancel path (made when
        the task is, since a scope needs the running loop)."""
        self._scope = anyio.CancelScope()
        if self.life.ended:
            self._scope.cancel()
        return self._scope

    def hang_up(self, reason: Reason = Reason.SHUTDOWN) -> None:
        """A graceful shutdown's request: SIGHUP (then SIGCONT) to the process group."""
        if self.process.hang_up():
            self.life.hung_up(reason)

    def kill(self) -> None:
        """What a hang-up left running is killed (the whole tree); the session ends as its
        process does, its exit sent."""
        if not self.life.settled:
            self.process.kill()

    def feed_stdin(self, data: bytes) -> int:
        """Input for the process: the bytes it took now (the rest is queued). The terminal's
        state is read first: a recording must know whether it is read unseen."""
        self.bytes_in += len(data)
        if self.typing is not None and self.spec.pty:
            self._typed_at = self.typing.typed()
        hidden_run = None
        if (terminal := self.terminal) is not None:
            hidden_run = terminal.look(self.bytes_out, self.sink, *self.observers)
        for tap in self.taps:
            tap.typed(data, hidden_run)
        return self.stdin.feed(data)

    def watch_terminal(self) -> TerminalState | None:
        """The terminal's state, watched from now on (section 14); None for pipes."""
        if self.terminal is None and self.spec.pty:
            self.terminal = TerminalState(self.process.terminal_flags, self.modes)
        return self.terminal

    def resize(self, rows: int, cols: int) -> None:
        self.size = (rows, cols)
        self.process.resize(rows, cols)
        for tap in self.taps:
            tap.resized(rows, cols)

    def prologue(self) -> str | None:
        """What puts a fresh terminal in the modes the output set; None when there is none."""
        return (self.modes.prologue() or None) if self.modes is not None else None

    def redraw(self, unless_within: float = 0.0) -> None:
        """A terminal attached afresh: SIGWINCH to the foreground program, which redraws
        (not again within ``unless_within`` seconds of the last one)."""
        now = time.monotonic()
        if self.life.final is None and now - self._redrawn_at >= unless_within:
            self._redrawn_at = now
            self.process.send_signal(signal.SIGWINCH)

    def control(self, message: Message) -> None:
        """Apply `resize` or `signal` at once: they do not wait behind stdin."""
        if isinstance(message, Resize):
            self.resize(message.rows, message.cols)
        elif isinstance(message, Signal):
            self.process.send_signal(signal.Signals["SIG" + message.name])

    def _stdin_consumed(self, size: int) -> None:
        """The process took input queued before: its credit to the channel that sent it."""
        if (channel := self.feeder or self.sink) is not None:
            channel.stdin_consumed(size)

    # --- the pumps' owner -----------------------------------------------------------

    def output_limit(self) -> int:
        """What a pump may read now: the sink's credit, or a chunk's worth when detached."""
        sink = self.sink
        limit = OUTPUT_CHUNK if sink is None else sink.limit()
        return limit if self.typing is None else self.typing.limit(limit, self._typed_at)

    def deliver(self, kind: FrameKind, data: bytes) -> bool:
        """Output to the ring, the taps, the observers and the sink; whether the sink takes
        more (the writer's alone: observers never hold the process back)."""
        offset = self.bytes_out
        self.bytes_out += len(data)
        if self.ring is not None:
            self.ring.append(kind, data)
            if self.modes is not None:
                self.modes.feed(data)
        if (terminal := self.terminal) is not None:  # a change: told before the output
            terminal.output(data)
            terminal.look(offset, self.sink, *self.observers)
        for tap in self.taps:
            tap.output(kind, data)
        sink = self.sink
        room = sink is None or sink.send_output(kind, data)  # the writer's first: a keystroke's
        for observer in self.observers:  # echo is not held up by what the observers cost
            observer.output(kind, data)
        return room

    def splices(self) -> bool:
        """Whether output may go from its pipe straight to the sink: only where nothing
        else needs the bytes (no ring, no tap, no observer) and the sink is a Unix socket."""
        sink = self.sink
        return (sink is not None and self.ring is None and not self.taps
                and not self.observers and sink.splices)

    def deliver_from_pipe(self, kind: FrameKind, pipe: int, size: int) -> bool:
        """`deliver` of the next ``size`` bytes of ``pipe``, spliced to the sink (`splices`)."""
        assert self.sink is not None
        self.bytes_out += size
        return self.sink.splice_output(kind, pipe, size)

    def pump_done(self, pump: OutputPump) -> None:
        if self.streams.ended_one():
            self._act(self.life.step(Event.OUTPUT_OVER))

    def pump_failed(self, error: Exception) -> None:
        self.fault = error
        self._act(self.life.end(Reason.CANCELLED))

    # --- the life cycle -----------------------------------------------------------------

    def start(self, ended: Ended) -> bool:
        """Watch the output streams and the exit. True when the loop's readiness callbacks do
        all of it: the session needs no task while it runs, and ``ended`` is told once its
        output is over and its exit offered (with the status), or once it must be ended
        (cancelled, a fault: with None). False when part of it has no callbacks here: the
        session then runs in a task of its own (`run`)."""
        if self.start_output() or self._exit_watch is None:
            return False
        self._ended = ended
        if self.life.ended:
            self._end_now()
        else:
            self._tell_if_over()
        return True

    async def run(self) -> Exit:
        """The session's task, where the loop has no callbacks for all of it (`start` said
        so): reap the process, read its output to the end, offer the exit; the status. Run
        within `cancel_scope`, whose cancellation is the cancel path: the process is killed
        and reaped, nothing more is sent, and the cancellation goes on up (a fault of the
        session's own code, `fault`, cancels it too)."""
        try:
            if not self.streams.tasks:
                return await self._run()
            async with anyio.create_task_group() as group:  # the pumps wait in tasks of
                for pump in self.streams.tasks:  # their own
                    group.start_soon(pump.run)
                status = await self._run()
            return status
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """The session is over, or ended: no more callbacks; the process is killed if it
        still runs, reaped, and its descriptors released."""
        self.stop_output()
        await self.process.aclose()
        self.released = True

    def close(self) -> None:
        """`aclose` of a session over on callbacks alone, its process reaped: no waiting."""
        self.stop_output()
        self.process.release()
        self.released = True

    async def _run(self) -> Exit:
        if self._exit_watch is not None:
            self._exit_watch.stop()  # this task waits for the exit instead
        if self.life.status is None:
            self.reaped(await self.process.wait())
        await self.streams.linger()
        if self.life.phase is Phase.SETTLING:  # (what it left could not be killed at once)
            await self._kill_tree()
        assert self.life.status is not None
        return self.life.status

    def reaped(self, status: Exit) -> None:
        """The process has ended with ``status``: the exit goes once the output has (within
        the linger grace, where the loop keeps time for the session)."""
        action = self.life.reaped(status)
        if self._ended is not None:  # the loop keeps the time
            self.streams.linger_soon()
        self._act(action)

    def _act(self, action: Action | None) -> None:
        """Carry out what a step of the life asked for (the one place that does); then tell
        the registry if the session is over on callbacks alone."""
        if action is Action.SETTLE:
            self._settle_tree()
        elif action is Action.FINAL:
            self._final()
        elif action is Action.KILL:
            self._end_now()
        elif action is Action.FORGET and (forget := self.on_forget) is not None:
            forget(self)
        self._tell_if_over()

    def timed_out(self) -> None:
        """Its detached deadline (`deadline`) passed: abandoned, or let go (life.py)."""
        self._act(self.life.timed_out())

    def forgotten(self) -> None:
        """The registry let it go."""
        self._act(self.life.step(Event.FORGOTTEN))

    def deadline(self, keep_ended: float) -> float | None:
        """When, detached, it times out: --keep-ended after its exit went out, else its
        detached timeout after it was left; None while a writer holds it (or an HTTP
        write: an `input` channel, which counts as the writer did before it had a role)."""
        if self.detached_at is None or self.sink is not None or any(
                observer.role == INPUT for observer in self.observers):
            return None
        if self.delivered_at is not None:
            return self.delivered_at + keep_ended
        return self.detached_at + self.detached_timeout

    def _tell_if_over(self) -> None:
        if self.output_over and (ended := self._ended) is not None:
            self._ended = None
            ended(self, self.life.status)

    @property
    def output_over(self) -> bool:
        """Whether the process was reaped, every stream reached its end (or was cut short by
        the linger) and what the process left running in its cgroup is dealt with: nothing
        more is read, the exit may go."""
        return self.life.settled

    def _settle_tree(self) -> None:
        """Once the output is over: kill what the process left running (--leftovers kill, or
        a session being ended), or leave it. Where that has to wait, a task does it on
        callbacks alone (`run` does it itself)."""
        kill = self._kill_leftovers or self.life.reason is not None
        if self.process.settle_nowait(kill):
            self._act(self.life.step(Event.SETTLED))
        elif self._ended is not None:
            self._start_task(self._kill_tree)

    async def _kill_tree(self) -> None:
        """Kill what the process left running and wait until it is gone; then the exit."""
        await self.process.settle(kill=True)
        self._act(self.life.step(Event.SETTLED))

    def _final(self) -> None:
        """The exit is final (the first time): the recording's last event, the observers'
        exits; then it is offered to the writer."""
        final = self.life.final
        assert final is not None
        for tap in self.taps:
            tap.exited(final)
        for observer in list(self.observers):
            observer.finish(final)
        self._offer_exit()

    def _offer_exit(self) -> None:
        """The one place the exit goes out: once the life says it is ready (after every
        output frame), to the sink whose replay is over, as the sink's last frame. A
        detachable session keeps it for each later attach, until the registry forgets the
        session."""
        status = self.life.final
        if not self.life.exit_ready or status is None:
            return
        sink = self.sink
        if sink is not None and sink.live:
            self.sink = None
            self._writer_gone()
            if sink.send_exit(status):
                self._act(self.life.step(Event.DELIVERED))
                if self.detachable:
                    # Kept a while all the same (section 10's --keep-ended): the client may
                    # not have read it before its connection broke, and attaches again for it.
                    self.delivered_at = self.detached_at = time.monotonic()
                    if self.on_delivered is not None:
                        self.on_delivered(self)
                return
            self.detached_at = time.monotonic()  # its channel had ended: as detached
        if not self.detachable:
            self._act(self.life.step(Event.DELIVERED))  # nobody can attach: it has nowhere to go

    def start_output(self) -> list[OutputPump]:
        """Watch the output streams and the process's exit; the pumps that need a task of
        their own (none where the loop calls back on readiness)."""
        self._exit_watch = self.process.watch_exit(self.reaped)
        return self.streams.start()

    def stop_output(self) -> None:
        """No more reading, and what read is let go (cycles that would keep an ended
        session until a collection)."""
        if self._exit_watch is not None:
            self._exit_watch.close()
        self._exit_watch = None
        self.streams.stop()
