"""A session's life as data: its phases, what moves it from one to the next, and what each
move asks of its driver.

A session ends either by itself (its process reaped, its output read to the end within the
linger, what it left in its cgroup dealt with: then its exit goes out, once, after all of its
output) or because it was ended from outside (a cancel, the detached timeout, a fault: its
tree is killed and reaped, and nothing more is sent). Nothing here waits or does I/O: the
session's drivers (its readiness callbacks, or its task: session.py) feed the life events and
carry out the actions it answers; the registry writes the journal from it. Attached or
detached is beside the phase (the session's sink), not part of it. As protocol/channels.py
does for channels, after h11's _state.py.
"""

from __future__ import annotations

import enum

from ...protocol.messages import Exit
from ..journal import Reason


class Phase(enum.Enum):
    RUNNING = "running"  # the process runs; its output is read
    QUIET = "quiet"  # its output reached its end; the process is not reaped yet
    DRAINING = "draining"  # reaped; its output is read to its end, within the linger
    SETTLING = "settling"  # reaped, output over: what it left in its cgroup is killed or left
    EXITED = "exited"  # its exit is ready: it goes to a writer whose replay is over
    DELIVERED = "delivered"  # its exit went out (or a session nobody can attach has no writer)
    ENDING = "ending"  # ended from outside: killed and reaped, nothing more is sent
    GONE = "gone"  # forgotten: no attach finds it


class Event(enum.Enum):
    REAPED = "reaped"  # the process's status is known
    OUTPUT_OVER = "output_over"  # every stream reached its end, or the linger cut it short
    SETTLED = "settled"  # what the process left running in its cgroup was killed or left
    DELIVERED = "delivered"  # its exit went out to the writer, or has nowhere to go
    ATTACHED = "attached"  # a writer attached to an ended session: its exit goes out again
    ENDED = "ended"  # a cancel, a fault: end it now
    TIMED_OUT = "timed_out"  # detached too long: a running one is abandoned (ended), an
    # ended one's exit was not collected in time, or went out --keep-ended ago
    FORGOTTEN = "forgotten"  # the registry let it go (its end written, its exit not wanted)


class Action(enum.Enum):
    """What a move asks of the driver."""

    SETTLE = "settle"  # kill (or leave) what the process left running; then SETTLED
    FINAL = "final"  # the exit is final: tell the recording and the observers; offer it
    KILL = "kill"  # end now: kill and reap the tree; the end has no status to send
    FORGET = "forget"  # the registry lets it go: no attach finds it any more


P, E, A = Phase, Event, Action
_LIVE = (P.RUNNING, P.QUIET, P.DRAINING, P.SETTLING)

# Every move, as data: (phase, event) -> (next phase, action). Every other pair leaves the
# phase as it is and asks nothing (`IGNORED` names them: a cancel that comes after the
# exit, say); `step` refuses a pair in neither, which would be a driver's bug.
TRANSITIONS: dict[tuple[Phase, Event], tuple[Phase, Action | None]] = {
    (P.RUNNING, E.REAPED): (P.DRAINING, None),
    (P.RUNNING, E.OUTPUT_OVER): (P.QUIET, None),
    (P.QUIET, E.REAPED): (P.SETTLING, A.SETTLE),
    (P.DRAINING, E.OUTPUT_OVER): (P.SETTLING, A.SETTLE),
    (P.SETTLING, E.SETTLED): (P.EXITED, A.FINAL),
    (P.EXITED, E.DELIVERED): (P.DELIVERED, None),
    (P.DELIVERED, E.ATTACHED): (P.EXITED, None),  # (offered once the replay is over)
    (P.EXITED, E.FORGOTTEN): (P.GONE, None),
    (P.DELIVERED, E.FORGOTTEN): (P.GONE, None),
    (P.ENDING, E.FORGOTTEN): (P.GONE, None),
    (P.EXITED, E.TIMED_OUT): (P.GONE, A.FORGET),  # its exit was not collected in time
    (P.DELIVERED, E.TIMED_OUT): (P.GONE, A.FORGET),  # kept --keep-ended after it went out
    **{(phase, E.ENDED): (P.ENDING, A.KILL) for phase in _LIVE},
    **{(phase, E.TIMED_OUT): (P.ENDING, A.KILL) for phase in _LIVE},  # abandoned
}
IGNORED: frozenset[tuple[Phase, Event]] = frozenset({
    *((phase, E.ATTACHED) for phase in _LIVE),  # a writer of a running session: no exit yet
    (P.EXITED, E.ATTACHED),  # its exit waits for this writer's replay
    (P.EXITED, E.ENDED), (P.DELIVERED, E.ENDED),  # it had ended by itself already
    (P.DELIVERED, E.DELIVERED),  # (a writer that came back for it, gone again)
    *((P.ENDING, event) for event in Event if event is not E.FORGOTTEN),  # nothing more
    *((P.GONE, event) for event in Event),
})


class LifeError(Exception):
    """An event its phase has no move for: a driver's bug."""


class Life:
    """One session's phase, and what its end is known by: the status, the reason it was
    ended for, whether its start and end are in the journal. Only its own methods change
    it: `step` (and `reaped`, `end`, `timed_out`, which feed it an event), and the facts
    beside the phase (`hung_up`, `started`, `closed`)."""

    __slots__ = ("final", "over", "phase", "reason", "recorded", "status")

    def __init__(self) -> None:
        self.phase = Phase.RUNNING
        self.status: Exit | None = None  # the process's, once reaped
        self.final: Exit | None = None  # its exit, once its output is over (EXITED)
        self.reason: Reason | None = None  # why it was ended from outside, or hung up
        self.recorded = False  # its start record is in the journal: it gets an end
        self.over = False  # its end is all done (record written): the registry says so

    @classmethod
    def restored(cls, recorded: bool, final: Exit | None, delivered: bool) -> Life:
        """The life of a session handed over by an upgrade in place: running, or over
        (``final``) with its exit waiting for a client or ``delivered`` already."""
        life = cls()
        life.recorded = recorded
        if final is not None:
            life.status = life.final = final
            life.phase = Phase.DELIVERED if delivered else Phase.EXITED
            life.over = True
        return life

    def started(self, recorded: bool) -> None:
        """Its start record is in the journal (``recorded``), or it has none."""
        self.recorded = recorded

    def hung_up(self, reason: Reason) -> None:
        """Asked to end (SIGHUP) for ``reason``, which it ends for if that ends it."""
        self.reason = self.reason or reason

    def closed(self) -> None:
        """Its end is all done: its channel ended, its record written."""
        self.over = True

    def step(self, event: Event) -> Action | None:
        """Move on ``event``; the action the move asks for, if any."""
        move = TRANSITIONS.get((self.phase, event))
        if move is None:
            if (self.phase, event) in IGNORED:
                return None
            raise LifeError(f"{event.value} while {self.phase.value}")
        self.phase, action = move
        if action is Action.FINAL:
            self.final = self.status
        return action

    def reaped(self, status: Exit) -> Action | None:
        """The process's status is known."""
        self.status = status
        return self.step(Event.REAPED)

    def end(self, reason: Reason) -> Action | None:
        """End it from outside for ``reason`` (the first reason given stands)."""
        self.reason = self.reason or reason
        return self.step(Event.ENDED)

    def timed_out(self) -> Action | None:
        """Its detached deadline passed: a running session is abandoned, an ended one let go."""
        if self.phase in _LIVE:
            self.reason = self.reason or Reason.ABANDONED
        return self.step(Event.TIMED_OUT)

    @property
    def ended(self) -> bool:
        """Ended from outside: nothing more is sent."""
        return self.phase is Phase.ENDING

    @property
    def in_transition(self) -> bool:
        """Whether it is being ended, or is over but not yet let go (its end record, its
        leftovers): an upgrade waits for that to finish."""
        return not self.over and (self.reason is not None or self.phase not in (
            Phase.RUNNING, Phase.QUIET, Phase.DRAINING))

    @property
    def exit_ready(self) -> bool:
        """Whether its exit waits to go to a writer (EXITED)."""
        return self.phase is Phase.EXITED

    @property
    def settled(self) -> bool:
        """Reaped, its output over and its tree dealt with: nothing more is read, the exit
        may go (or went)."""
        return self.phase in (Phase.EXITED, Phase.DELIVERED, Phase.GONE)

    def end_reason(self, status: Exit | None) -> Reason:
        """The journal's `reason` for an end with ``status`` (None: it was ended, so it
        never sent one). A process that exited by itself, with a code of its own, ends with
        `exit` whatever else happened meanwhile; a hang-up is the reason only for a process
        it ended (a death by a signal after the hang-up)."""
        if status is None:
            return self.reason or Reason.CANCELLED
        if self.reason is Reason.SHUTDOWN and status.signal is not None:
            return Reason.SHUTDOWN
        return Reason.EXIT
