"""An observer's backlog, stepped with no event loop: it never holds the process back, it is
skipped forward past a scrollback with exact per-stream offsets, and its exit follows its
backlog."""

from __future__ import annotations

from server.fakes import FakeProcess, Wire, controls, make_session

from ttyserve.protocol.frames import FrameKind, encode_frame
from ttyserve.protocol.messages import Exit, Offsets, Window, encode_message
from ttyserve.server.channels.observer import Observer
from ttyserve.server.sessions.pump import OutputPump, Stall

RING = 4096  # make_session's scrollback: an observer's backlog holds no more


def _window(wire: Wire, channel: int, size: int) -> None:
    """The client grants ``size`` bytes of output credit on ``channel``."""
    wire.core.receive_data(encode_frame(FrameKind.CTRL_IN, channel,
                                        encode_message(Window(bytes=size))))
    wire.core.next_event()


def _close_output(process: FakeProcess, stdout: OutputPump, stderr: OutputPump) -> None:
    """The process closes its stdout and stderr: both pumps read to their end."""
    process.stdout.close()
    assert process.stderr is not None
    process.stderr.close()
    assert stdout.step() is Stall.DONE and stderr.step() is Stall.DONE


def test_a_stalled_observer_is_skipped_with_exact_offsets_on_both_streams() -> None:
    session, process = make_session(pty=False)
    stdout, _ = session.start_output()
    wire = Wire(window=1)  # one byte of credit, never more until the test grants it
    writer = wire.opened(session)
    watcher_channel = wire.open_channel(pty=False)
    observer = Observer.attach(wire, watcher_channel, session)
    assert [c["type"] for c in controls(wire.frames(), writer.channel)] == [
        "opened", "audience"]
    _window(wire, writer.channel, 1 << 20)  # the writer reads everything
    sent = {FrameKind.STDOUT: 0, FrameKind.STDERR: 0}
    total = {FrameKind.STDOUT: 0, FrameKind.STDERR: 0}
    for round_ in range(20):  # 20 x 1 KiB on stdout and 512 bytes on stderr, interleaved
        process.stdout.write(bytes([round_]) * 1024)
        assert stdout.step() is Stall.READABLE  # all of it read: the observer held nothing
        total[FrameKind.STDOUT] += 1024
        session.deliver(FrameKind.STDERR, b"e" * 512)
        total[FrameKind.STDERR] += 512
    assert not observer.backlog  # a scrollback behind: parked, the ring is its source
    _window(wire, watcher_channel, 1 << 20)
    observer.resume()
    skipped = 0
    positions = {FrameKind.STDOUT: 0, FrameKind.STDERR: 0}
    for frame in wire.frames():
        if frame.channel != watcher_channel:
            continue
        if frame.kind in sent:
            positions[frame.kind] += len(frame.payload)
            sent[frame.kind] += len(frame.payload)
            continue
        message = controls([frame], watcher_channel)[0]
        if message["type"] == "skipped":
            skipped += int(message["bytes"])  # type: ignore[call-overload]
            at = Offsets(**message["offsets"])  # type: ignore[arg-type]
            # Where the streams go on: past everything sent or skipped before.
            assert at.stdout >= positions[FrameKind.STDOUT]
            assert at.stderr >= positions[FrameKind.STDERR]
            positions = {FrameKind.STDOUT: at.stdout, FrameKind.STDERR: at.stderr}
    assert positions == total  # each stream's offsets line up to its end
    assert skipped + sum(sent.values()) == sum(total.values())  # each byte once


def test_the_observers_exit_follows_its_backlog_and_the_process_never_waited() -> None:
    session, process = make_session(pty=False)
    stdout, stderr = session.start_output()
    wire = Wire(window=16)
    channel = wire.open_channel(pty=False)
    observer = Observer.attach(wire, channel, session)
    process.stdout.write(b"x" * 100)
    assert stdout.step() is Stall.READABLE  # no writer: nothing waited for the observer
    _close_output(process, stdout, stderr)
    session.reaped(Exit(code=3))
    assert not wire.ended  # 84 bytes still wait for credit: no exit before them
    _window(wire, channel, 1000)
    observer.resume()
    frames = [f for f in wire.frames() if f.channel == channel]
    assert b"".join(f.payload for f in frames if f.kind is FrameKind.STDOUT) == b"x" * 100
    assert controls(frames, channel)[-1] == {"type": "exit", "code": 3}
    assert wire.ended == [observer] and session.observers == []


def test_an_observer_with_credit_gets_a_chunk_larger_than_the_scrollback_whole() -> None:
    """Only what waits beyond a scrollback is skipped: one read larger than the ring goes
    out whole to an observer that keeps up."""
    session, _ = make_session(pty=False)
    wire = Wire(window=1 << 20)
    channel = wire.open_channel(pty=False)
    Observer.attach(wire, channel, session)
    session.deliver(FrameKind.STDOUT, b"z" * (RING + 6000))
    frames = wire.frames()
    assert b"".join(f.payload for f in frames if f.kind is FrameKind.STDOUT) == (
        b"z" * (RING + 6000))
    assert [c["type"] for c in controls(frames, channel)] == ["attached"]  # nothing skipped


def test_a_stalled_observers_backlog_of_tiny_writes_stays_within_a_scrollback() -> None:
    """A flood of one-byte writes to an observer that never reads: the backlog is counted as
    the ring counts (a cost per chunk), so it is parked once a scrollback behind, holding
    nothing of its own, not one object per byte; then it gets what the ring holds."""
    session, _ = make_session(pty=False)
    wire = Wire(window=1)
    channel = wire.open_channel(pty=False)
    observer = Observer.attach(wire, channel, session)
    for _ in range(2000):  # within a scrollback: kept, joined into one chunk
        session.deliver(FrameKind.STDOUT, b".")
    assert len(observer.backlog) == 1 and len(observer.backlog[0][1]) == 1999  # (1 was sent)
    for _ in range(98_000):
        session.deliver(FrameKind.STDOUT, b".")
    assert not observer.backlog  # parked: nothing of its own
    _window(wire, channel, 1 << 20)
    observer.resume()
    frames = wire.frames()
    (skipped,) = [c for c in controls(frames, channel) if c["type"] == "skipped"]
    sent = sum(len(f.payload) for f in frames if f.kind is FrameKind.STDOUT)
    assert sent + int(skipped["bytes"]) == 100_000  # type: ignore[call-overload]


def test_a_parked_observer_gets_the_ring_then_skipped_then_the_exit() -> None:
    session, process = make_session(pty=False)
    stdout, stderr = session.start_output()
    wire = Wire(window=1)
    channel = wire.open_channel(pty=False)
    observer = Observer.attach(wire, channel, session)
    process.stdout.write(bytes(range(256)) * 64)  # 16 KiB: four scrollbacks
    while process.stdout.buffered:  # no writer: the pump reads all, never held by the observer
        assert stdout.step() is Stall.READABLE
    _close_output(process, stdout, stderr)
    session.reaped(Exit(code=0))
    assert not observer.backlog and not wire.ended  # parked, its exit waits for it
    _window(wire, channel, 1 << 20)
    observer.resume()
    frames = [f for f in wire.frames() if f.channel == channel]
    messages = controls(frames, channel)
    assert [m["type"] for m in messages] == ["attached", "skipped", "exit"]
    data = b"".join(f.payload for f in frames if f.kind is FrameKind.STDOUT)
    skipped = int(messages[1]["bytes"])  # type: ignore[call-overload]
    assert messages[1]["offsets"] == {"stdout": 1 + skipped, "stderr": 0}  # after the first byte
    assert len(data) + skipped == 256 * 64 and data[1:] == (bytes(range(256)) * 64)[
        1 + skipped:]  # the newest output, whole, in order
    assert len(data) - 1 <= RING and wire.ended == [observer]
