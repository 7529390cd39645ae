"""The session's life (server/sessions/life.py): its table, and a real session driven through it in
every order hypothesis finds (its process, output, reaping, cancels, detaches and attaches,
a writer without room), against the contract: the exit once, last, after the replay and all
output; nothing of an ended session sent after its end; the journal's reason right."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from server.fakes import Wire, make_session

from ttyserve.protocol.frames import FrameKind, encode_frame
from ttyserve.protocol.messages import Cancel, Exit, encode_message, parse_object
from ttyserve.server.channels.attachment import Attachment
from ttyserve.server.journal import Reason
from ttyserve.server.sessions.life import (
    IGNORED,
    TRANSITIONS,
    Action,
    Event,
    Life,
    LifeError,
    Phase,
)
from ttyserve.server.sessions.pump import OutputPump, Stall


def test_an_event_is_a_move_ignored_or_refused_as_a_drivers_bug() -> None:
    for phase in Phase:
        for event in Event:
            life = Life()
            life.phase = phase
            if (phase, event) in TRANSITIONS:
                assert (phase, event) not in IGNORED
                assert (life.step(event), life.phase) == TRANSITIONS[phase, event][::-1]
            elif (phase, event) in IGNORED:
                assert life.step(event) is None and life.phase is phase
            else:
                with pytest.raises(LifeError):
                    life.step(event)


def test_a_detached_deadline_abandons_a_running_session_and_lets_an_ended_one_go() -> None:
    """What a passed deadline means is the life's: a running session is ended (abandoned,
    unless it was asked to end for another reason first), an ended one is forgotten,
    whether its exit went out (--keep-ended) or not (uncollected); one being ended waits."""
    for phase in (Phase.RUNNING, Phase.QUIET, Phase.DRAINING, Phase.SETTLING):
        life = Life()
        life.phase = phase
        assert life.timed_out() is Action.KILL
        assert (life.phase, life.reason) == (Phase.ENDING, Reason.ABANDONED)
    hung_up = Life()
    hung_up.hung_up(Reason.SHUTDOWN)
    assert hung_up.timed_out() is Action.KILL and hung_up.reason is Reason.SHUTDOWN
    for phase in (Phase.EXITED, Phase.DELIVERED):
        life = Life.restored(True, Exit(code=0), delivered=phase is Phase.DELIVERED)
        assert life.phase is phase
        assert life.timed_out() is Action.FORGET and life.phase is Phase.GONE
        assert life.reason is None
    ending = Life()
    ending.end(Reason.CANCELLED)
    assert ending.timed_out() is None and ending.reason is Reason.CANCELLED


def test_the_exit_is_final_only_after_the_reap_the_output_and_the_tree() -> None:
    """Whatever order the three come in, FINAL is asked once, by the last of them."""
    for order in ([Event.REAPED, Event.OUTPUT_OVER], [Event.OUTPUT_OVER, Event.REAPED]):
        life = Life()
        actions = [life.reaped(Exit(code=1)) if e is Event.REAPED else life.step(e)
                   for e in order]
        assert actions == [None, Action.SETTLE] and life.final is None
        assert life.step(Event.SETTLED) is Action.FINAL and life.final == Exit(code=1)


def test_an_ended_life_asks_for_nothing_more_but_its_forgetting() -> None:
    life = Life()
    assert life.end(Reason.ABANDONED) is Action.KILL
    for event in Event:
        if event is not Event.FORGOTTEN:
            assert life.step(event) is None and life.phase is Phase.ENDING
    assert life.end(Reason.CANCELLED) is None and life.reason is Reason.ABANDONED
    assert life.step(Event.FORGOTTEN) is None and life.phase is Phase.GONE


def test_a_running_session_is_never_forgotten() -> None:
    with pytest.raises(LifeError):
        Life().step(Event.FORGOTTEN)


class SessionLife(RuleBasedStateMachine):
    """One session (detachable or not, a PTY or pipes) and the channels attached to it, on
    a real protocol core; what the process writes is the model's, what went out is the
    wire's."""

    def __init__(self) -> None:
        super().__init__()
        self.session, self.process = make_session(detachable=True)
        self.wire = Wire()
        self.channel: Attachment | None = self.wire.opened(self.session)
        self.pumps: list[OutputPump] = self.session.start_output()
        self.written = {FrameKind.STDOUT: b"", FrameKind.STDERR: b""}
        self.closed: set[FrameKind] = set()
        self.status: Exit | None = None
        self.cancelled: Reason | None = None
        self.received: dict[int, list[tuple[FrameKind, bytes]]] = {}
        self.begins: dict[int, dict[FrameKind, int]] = {self.channel.channel: {
            FrameKind.STDOUT: 0, FrameKind.STDERR: 0}}
        self.exits: list[int] = []  # the channels an exit went to, in order
        self.sent_when_ended: int | None = None  # frames that had gone out by its end

    @initialize(leftovers=st.booleans())
    def tree(self, leftovers: bool) -> None:
        """With ``leftovers`` its process leaves something running in its cgroup: settling
        its tree then waits (`settle`) instead of being done at once."""
        self.process.settle_nowait = lambda kill: not leftovers  # type: ignore[method-assign]

    @precondition(lambda self: self.session.life.phase is Phase.SETTLING)
    @rule()
    def leftovers_gone(self) -> None:
        """What the process left is killed and gone (the end of `_kill_tree`)."""
        self.session._act(self.session.life.step(Event.SETTLED))
        self._collect()

    # --- the process and the loop ----------------------------------------------------

    def _source(self, kind: FrameKind) -> object:
        return self.process.stdout if kind is FrameKind.STDOUT else self.process.stderr

    def _step_pumps(self) -> None:
        for pump in list(self.session.streams.pumps):  # (the stderr pump is made when it is read)
            for _ in range(8):
                if pump.step() is not Stall.READABLE or pump.done:
                    break
        self._collect()

    @rule(kind=st.sampled_from([FrameKind.STDOUT, FrameKind.STDERR]),
          data=st.binary(min_size=1, max_size=40))
    def write(self, kind: FrameKind, data: bytes) -> None:
        if kind in self.closed or (self.status is not None and self.session.output_over):
            return
        source = self._source(kind)
        source.write(data)  # type: ignore[attr-defined]
        self.written[kind] += data
        self._step_pumps()

    @rule(kind=st.sampled_from([FrameKind.STDOUT, FrameKind.STDERR]))
    def close(self, kind: FrameKind) -> None:
        self._source(kind).close()  # type: ignore[attr-defined]
        self.closed.add(kind)
        self._step_pumps()

    @precondition(lambda self: self.status is None)
    @rule(code=st.integers(min_value=0, max_value=3))
    def reap(self, code: int) -> None:
        self.status = Exit(code=code)
        self.process.status = self.status
        self.session.reaped(self.status)
        self._collect()

    @rule(room=st.booleans())
    def room(self, room: bool) -> None:
        self.wire.room = room
        if self.channel is not None:
            self.channel.resume()
        self._step_pumps()

    @precondition(lambda self: self.sent_when_ended is None)
    @rule()
    def cancel(self) -> None:
        """The client's `cancel` on its channel, or the detached timeout without one."""
        reason = Reason.CANCELLED
        if self.channel is not None:
            self.wire.core.receive_data(encode_frame(FrameKind.CTRL_IN, self.channel.channel,
                                                     encode_message(Cancel())))
            self.wire.core.next_event()
            self.channel.release()  # (as the handler lets go of a cancelled channel)
            self.channel = None
        else:
            reason = Reason.ABANDONED
        if self.cancelled is None and not self.session.output_over:
            self.cancelled = reason
        self.session.cancel(reason)
        if self.session.life.ended:
            self.session.close()  # (what the registry does next: its pumps stop)
            self._collect()
            self.sent_when_ended = sum(map(len, self.received.values()))

    @precondition(lambda self: self.channel is not None and self.sent_when_ended is None)
    @rule()
    def detach(self) -> None:
        assert self.channel is not None
        self.session.detach()
        self.channel.release()
        self.channel = None
        self._collect()

    @precondition(lambda self: self.channel is None and self.sent_when_ended is None)
    @rule()
    def attach(self) -> None:
        if self.session.life.phase in (Phase.ENDING, Phase.GONE):
            return  # (the registry finds no such session)
        channel = self.wire.open_channel(pty=False)
        ring = self.session.ring
        assert ring is not None
        self.begins[channel] = dict(ring.start)
        self.channel = Attachment.attach(self.wire, channel, self.session)
        self._collect()

    # --- what went out -------------------------------------------------------------

    def _collect(self) -> None:
        for frame in self.wire.frames():
            frames = self.received.setdefault(frame.channel, [])
            if frame.kind in (FrameKind.STDOUT, FrameKind.STDERR):
                frames.append((frame.kind, frame.payload))
            elif frame.kind is FrameKind.CTRL_OUT:
                message = parse_object(frame.payload)[1]
                frames.append((FrameKind.CTRL_OUT, frame.payload))
                if message["type"] == "exit":
                    self.check_exit(frame.channel, message)
                    self.exits.append(frame.channel)
        if self.channel is not None and self.channel.released:
            self.channel = None  # its exit went out: the channel is over

    def check_exit(self, channel: int, message: dict[str, object]) -> None:
        """An exit: the real status, after all output (from where the channel began),
        never for a session ended from outside before its exit was final."""
        assert self.cancelled is None, "an exit after the session was ended"
        assert self.status is not None and message["code"] == self.status.code
        assert self.closed == {FrameKind.STDOUT, FrameKind.STDERR}
        for kind in (FrameKind.STDOUT, FrameKind.STDERR):
            got = b"".join(data for k, data in self.received.get(channel, []) if k is kind)
            assert got == self.written[kind][self.begins[channel][kind]:], kind

    @invariant()
    def the_exit_is_each_channels_last_frame(self) -> None:
        for channel in self.exits:
            frames = self.received[channel]
            assert frames[-1][0] is FrameKind.CTRL_OUT
            assert sum(b'"type":"exit"' in data for kind, data in frames
                       if kind is FrameKind.CTRL_OUT) == 1

    @invariant()
    def an_ended_sessions_exit_reaches_a_writer_whose_replay_is_over(self) -> None:
        if self.session.output_over and self.channel is not None:
            assert not self.channel.live, "a live writer of an ended session without its exit"

    @invariant()
    def nothing_goes_out_after_an_end_from_outside(self) -> None:
        if self.sent_when_ended is not None:
            assert sum(map(len, self.received.values())) == self.sent_when_ended

    @invariant()
    def the_journal_reason_is_the_first_cause(self) -> None:
        life = self.session.life
        if self.cancelled is not None:
            assert life.phase is Phase.ENDING and life.end_reason(None) is self.cancelled
        elif self.session.output_over:
            assert life.final == self.status and life.end_reason(self.status) is Reason.EXIT


TestSessionLife = SessionLife.TestCase
TestSessionLife.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
