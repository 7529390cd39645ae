"""The session's rules with no event loop: the exit after all output, exactly once, to a sink
whose replay is over; the pumps within the sink's credit; the reason of a hang-up."""

from __future__ import annotations

import signal

from server.fakes import FakeProcess, Wire, controls, make_session, output

from ttyserve.protocol.frames import FrameKind
from ttyserve.protocol.messages import Exit, Resize, Signal
from ttyserve.server.channels.attachment import Attachment
from ttyserve.server.channels.observer import Observer
from ttyserve.server.journal import Reason
from ttyserve.server.sessions.life import Event, Phase
from ttyserve.server.sessions.pump import OutputPump, Stall
from ttyserve.server.sessions.session import ServerSession


def started(session: ServerSession) -> list[OutputPump]:
    """The session's pumps, stepped by hand (a fake stream has no readiness callbacks)."""
    return session.start_output()


def end_stream(process: FakeProcess, pump: OutputPump, data: bytes = b"") -> None:
    source = process.stdout if pump.kind is FrameKind.STDOUT else process.stderr
    assert source is not None
    source.write(data)
    source.close()
    for _ in range(len(data) + 2):  # a step per chunk at most, and one to learn the end
        if pump.step() is Stall.DONE:
            return
    raise AssertionError("the pump did not reach the end of its stream")


def test_the_exit_waits_for_every_stream_and_goes_once_after_all_output() -> None:
    session, process = make_session(detachable=False)
    wire = Wire()
    attachment = wire.opened(session)
    stdout, stderr = started(session)
    session.reaped(Exit(code=3))
    assert controls(wire.frames(), attachment.channel) == [{"type": "opened", "pid": 4242}]
    end_stream(process, stdout, b"out")
    assert not session.output_over
    assert controls(wire.frames(), attachment.channel) == []  # stderr is still open
    end_stream(process, stderr, b"err")
    frames = wire.frames()
    assert [f.kind for f in frames] == [FrameKind.STDERR, FrameKind.CTRL_OUT]
    assert controls(frames, attachment.channel) == [{"type": "exit", "code": 3}]
    session.sink_ready()  # whatever wakes the session later, the exit is not sent again
    assert wire.frames() == []
    assert wire.ended == [attachment]


def test_output_that_ends_first_lets_the_exit_go_when_the_process_is_reaped() -> None:
    session, process = make_session(pty=True, detachable=False)
    wire = Wire()
    attachment = wire.opened(session)
    wire.frames()
    (stdout,) = started(session)
    end_stream(process, stdout, b"all of it")
    assert wire.frames()[0].payload == b"all of it"
    session.reaped(Exit(code=0))
    assert controls(wire.frames(), attachment.channel) == [{"type": "exit", "code": 0}]


def test_without_credit_a_pump_reads_one_byte_ahead_and_so_learns_of_the_end() -> None:
    session, process = make_session(pty=True, detachable=False)
    wire = Wire(window=4)
    attachment = wire.opened(session)
    wire.frames()
    (stdout,) = started(session)
    process.stdout.write(b"abcdef")
    assert stdout.step() is Stall.SINK  # 4 bytes went, the credit is spent
    assert output(wire.frames(), attachment.channel) == b"abcd"
    assert stdout.step() is Stall.SINK
    assert bytes(process.stdout.buffered) == b"f"  # "e" is held, nothing more is read
    process.stdout.close()
    session.reaped(Exit(code=0))
    assert controls(wire.frames(), attachment.channel) == []  # "ef" still has to go
    wire.core.receive_data(_window(attachment.channel, 10))
    wire.core.next_event()
    assert stdout.step() is Stall.READABLE
    assert stdout.step() is Stall.DONE
    frames = wire.frames()
    assert output(frames, attachment.channel) == b"ef"
    assert controls(frames, attachment.channel) == [{"type": "exit", "code": 0}]


def test_after_the_linger_a_pump_sends_what_is_buffered_and_stops() -> None:
    session, process = make_session(pty=True, detachable=False)
    wire = Wire()
    attachment = wire.opened(session)
    wire.frames()
    (stdout,) = started(session)
    session.reaped(Exit(code=0))
    process.stdout.write(b"buffered")  # a grandchild keeps the terminal open
    stdout.last_chunk()
    assert stdout.step() is Stall.READABLE  # (the callback goes on at once: see `readable`)
    assert stdout.step() is Stall.DONE  # nothing more buffered: no wait for the EOF
    process.stdout.write(b"later")
    assert stdout.step() is Stall.DONE
    frames = wire.frames()
    assert output(frames, attachment.channel) == b"buffered"
    assert controls(frames, attachment.channel) == [{"type": "exit", "code": 0}]


def test_after_the_linger_a_slow_client_still_gets_all_that_was_buffered() -> None:
    """The linger ends the wait for the end of output, never the output already written:
    a client that takes it slowly (here 4 bytes a grant) gets all of it, then the exit."""
    session, process = make_session(pty=True, detachable=False)
    wire = Wire(window=4)
    attachment = wire.opened(session)
    wire.frames()
    (stdout,) = started(session)
    process.stdout.write(b"abcdefghij")  # more than the sink takes at once
    session.reaped(Exit(code=0))
    stdout.last_chunk()
    sent = b""
    for _ in range(10):
        sent += output(wire.frames(), attachment.channel)
        if stdout.step() is Stall.DONE:
            break
        wire.core.receive_data(_window(attachment.channel, 4))
        wire.core.next_event()
    frames = wire.frames()
    assert sent + output(frames, attachment.channel) == b"abcdefghij"
    assert controls(frames, attachment.channel) == [{"type": "exit", "code": 0}]


def test_a_closed_session_never_watches_its_streams_again() -> None:
    """Once a session is over (`close`), its pumps stay stopped whatever its sink says later
    (credit, room, an attach during the kill): its descriptors are released, and a watch
    would read whatever reuses their numbers."""
    session, process = make_session(pty=True, watchable=True)
    Wire().opened(session)
    started(session)
    watcher = process.stdout.watcher
    assert watcher is not None and watcher.active
    session.close()
    assert not watcher.active and process.released
    session.sink_ready()
    assert not watcher.active


def test_the_exit_waits_for_the_replay_and_follows_it() -> None:
    session, process = make_session(pty=True)
    (stdout,) = started(session)
    end_stream(process, stdout, b"x" * 3000)  # detached: into the ring only
    session.reaped(Exit(code=5))
    assert session.pending_exit == Exit(code=5)
    delivered = []
    session.on_delivered = lambda ended: delivered.append(ended is session)
    wire = Wire(window=1000)
    channel = wire.open_channel()
    attachment = Attachment.attach(wire, channel, session)
    frames = wire.frames()
    assert [c["type"] for c in controls(frames, channel)] == ["attached"]
    assert output(frames, channel) == b"x" * 1000 and not attachment.live
    wire.core.receive_data(_window(channel, 1000))  # 1,000 bytes a grant: no exit yet
    wire.core.next_event()
    attachment.resume()
    frames = wire.frames()
    assert output(frames, channel) == b"x" * 1000
    assert not controls(frames, channel) and not delivered and not attachment.live
    wire.core.receive_data(_window(channel, 1000))
    wire.core.next_event()
    attachment.resume()
    frames = wire.frames()
    assert output(frames, channel) == b"x" * 1000
    assert controls(frames, channel) == [{"type": "exit", "code": 5}]
    assert delivered == [True] and session.pending_exit is None
    assert session.final == Exit(code=5) and session.delivered_at is not None  # kept a while


def test_a_non_detachable_session_with_nowhere_to_send_its_exit_keeps_nothing() -> None:
    session, process = make_session(pty=True, detachable=False)
    (stdout,) = started(session)
    end_stream(process, stdout)
    session.reaped(Exit(code=0))
    assert session.output_over and session.pending_exit is None


def test_an_exit_whose_channel_had_ended_waits_for_the_next_attach() -> None:
    session, process = make_session(pty=True)
    wire = Wire()
    attachment = wire.opened(session)
    wire.core.close()  # the connection is closing: nothing more is framed
    (stdout,) = started(session)
    end_stream(process, stdout)
    session.reaped(Exit(code=0))
    assert session.pending_exit == Exit(code=0)
    assert session.sink is None and session.detached_at is not None  # as if detached
    assert attachment.released


def test_a_hang_up_is_the_end_reason_only_of_a_process_it_ended() -> None:
    hung_up, _ = make_session()
    hung_up.hang_up()
    assert hung_up.life.end_reason(Exit(code=-1, signal="HUP")) is Reason.SHUTDOWN
    assert hung_up.life.end_reason(Exit(code=236)) is Reason.EXIT  # it ignored it, and exited
    assert hung_up.life.end_reason(None) is Reason.SHUTDOWN  # the watchdog killed it
    exited, process = make_session()
    process.status = Exit(code=-9, signal="KILL")  # it had died before the hang-up
    exited.hang_up()
    assert exited.life.end_reason(process.status) is Reason.EXIT and process.hung_up == 1
    cancelled, _ = make_session()
    cancelled.cancel()
    assert cancelled.life.end_reason(None) is Reason.CANCELLED
    assert make_session()[0].life.end_reason(Exit(code=0)) is Reason.EXIT


def test_stdin_the_process_takes_is_counted_and_signals_go_at_once() -> None:
    session, process = make_session(pty=True)
    assert session.feed_stdin(b"keys") == 4
    session.control(Signal(name="INT"))
    session.control(Resize(rows=30, cols=100))
    assert (bytes(process.stdin), session.bytes_in, process.signals) == (
        b"keys", 4, [signal.SIGINT])
    assert process.size == session.size == (30, 100)  # an attach naming rows alone keeps cols


def _window(channel: int, size: int) -> bytes:
    from ttyserve.protocol.frames import encode_frame
    from ttyserve.protocol.messages import Window, encode_message

    return encode_frame(FrameKind.CTRL_IN, channel, encode_message(Window(bytes=size)))


def test_a_session_ended_with_no_status_ends_its_channels_all_the_same() -> None:
    """A fault in the session's task (the registry's end with no status): its writer gets
    exit -1 with the reason, its observers how it died if that is known, and it is ended."""
    session, process = make_session()
    wire = Wire()
    writer = wire.opened(session)
    watcher = wire.open_channel(pty=False)
    Observer.attach(wire, watcher, session)
    wire.frames()
    process.status = Exit(code=-1, signal="KILL")  # (killed on the way)
    session.ended_without_status()
    frames = wire.frames()
    [lost] = controls(frames, writer.channel)
    assert lost["type"] == "exit" and lost["code"] == -1 and "lost" in str(lost["error"])
    assert controls(frames, watcher)[-1] == {"type": "exit", "code": -1, "signal": "KILL"}
    assert session.life.ended and session.sink is None


def test_a_cancel_while_its_leftovers_are_killed_ends_it_and_no_exit_follows() -> None:
    """Forced: the process exited, its output is over, what it left in its cgroup is being
    killed (settling waits) when a cancel comes. The session is ended; when the leftovers
    are gone, no exit goes out."""
    session, process = make_session(detachable=False)
    wire = Wire()
    attachment = wire.opened(session)
    stdout, stderr = started(session)
    process.settle_nowait = lambda kill: False  # type: ignore[method-assign]
    session.reaped(Exit(code=0))
    end_stream(process, stdout)
    end_stream(process, stderr)
    assert session.life.phase is Phase.SETTLING
    wire.frames()
    session.cancel()
    assert session.life.ended
    session._act(session.life.step(Event.SETTLED))  # (the end of `_kill_tree`)
    assert controls(wire.frames(), attachment.channel) == []
