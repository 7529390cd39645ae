"""A detached session across an upgrade in place (section 12): what new code in this
process needs to go on with it (`session_state`), and the session that goes on from that
(`adopted_session`)."""

from __future__ import annotations

from ...backends.base import ProcessHandle, ProcessSpec
from ...protocol.frames import FrameKind
from ..handover import ModesState, RingState, SessionState
from .life import Life
from .scrollback import Scrollback
from .session import ServerSession
from .sinks import HandsOver
from .stdin import StartTask


def session_state(session: ServerSession, dry: bool = False) -> SessionState:
    """What new code in this process needs to go on with this detached session (an upgrade
    in place); from now on its descriptors are the new code's (``dry``: only what that
    would be, changing nothing)."""
    assert session.ring is not None, "only detachable sessions go on"
    if not dry:
        assert session.sink is None, "only detached sessions go on"
        session.stop_output()
    spec, ring, modes = session.spec, session.ring, session.modes
    _, chunks = ring.since(ring.start[FrameKind.STDOUT], ring.start[FrameKind.STDERR])
    return SessionState(
        id=session.id, pid=session.pid, owner=session.owner, peer=session.peer,
        started=session.started, argv=spec.argv, pty=spec.pty, target=spec.target,
        rows=session.size[0],
        cols=session.size[1], term=spec.term,
        env=spec.env, cwd=spec.cwd, detached_at=session.detached_at,
        detached_timeout=session.detached_timeout, final=session.life.final,
        delivered_at=session.delivered_at, recorded=session.life.recorded,
        bytes_in=session.bytes_in, bytes_out=session.bytes_out, tree_settled=session.output_over,
        ring=RingState(size=ring.size, dropped=ring.dropped,
                       start=(ring.start[FrameKind.STDOUT], ring.start[FrameKind.STDERR]),
                       end=(ring.end[FrameKind.STDOUT], ring.end[FrameKind.STDERR]),
                       chunks=[(int(kind), data) for kind, data in chunks]),
        modes=None if modes is None else ModesState(
            modes=dict(modes.modes), keypad=modes.keypad, title=modes.title),
        process=None if session.released else session.process.handover(dry),
        recording=next((o.handover(dry) for o in session.taps
                        if isinstance(o, HandsOver)), None), key=session.key)


def adopted_session(state: SessionState, process: ProcessHandle, start_task: StartTask, *,
                    linger: float, kill_leftovers: bool) -> ServerSession:
    """The session `session_state` described, going on in this code with ``process``."""
    spec = ProcessSpec(argv=state.argv, pty=state.pty, rows=state.rows, cols=state.cols,
                       term=state.term, env=state.env, cwd=state.cwd, name=state.id,
                       target=state.target)
    session = ServerSession(state.id, process, spec, state.peer, start_task, linger=linger,
                  owner=state.owner, scrollback=state.ring.size,
                  detached_timeout=state.detached_timeout, kill_leftovers=kill_leftovers)
    kinds = (FrameKind.STDOUT, FrameKind.STDERR)
    ring = state.ring
    session.ring = Scrollback.restored(
        ring.size, ring.dropped, dict(zip(kinds, ring.start, strict=True)),
        dict(zip(kinds, ring.end, strict=True)),
        [(FrameKind(kind), data) for kind, data in ring.chunks])
    if session.modes is not None and state.modes is not None:
        session.modes.modes.update(state.modes.modes)
        session.modes.keypad, session.modes.title = state.modes.keypad, state.modes.title
    session.started, session.key = state.started, state.key
    session.detached_at = state.detached_at
    session.delivered_at = state.delivered_at
    session.bytes_in, session.bytes_out = state.bytes_in, state.bytes_out
    # Over, its exit waiting for a client or delivered already; or running.
    session.life = Life.restored(state.recorded, state.final, state.delivered_at is not None)
    session.released = state.final is not None
    return session
