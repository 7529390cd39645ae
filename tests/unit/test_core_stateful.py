"""Both protocol cores driven together by random client input and server output (hypothesis).

A small model of section 1 and 7 predicts the answer to every request. After
each step the server's bytes are checked three ways: against the model (answers
come in request order), by an independent wire checker (per channel one `exit`,
nothing after a channel's last frame, output within the credit granted), and
by the client core, which raises if the server broke any rule.
"""

from __future__ import annotations

import collections
import json

from helpers import ctrl
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ttyserve.errors import ErrorCode, RequestError
from ttyserve.protocol.client import ClientConnection
from ttyserve.protocol.frames import Frame, FrameDecoder, FrameKind
from ttyserve.protocol.messages import Exit, Hello, Open, Opened, Window, parse_object
from ttyserve.protocol.server import OpenRequested, ServerConnection, StdinReceived

OUTPUT_WINDOW = 64
STDIN_WINDOW = 48
CHANNELS = st.integers(1, 40)
MAX_RANGES = 4  # so that remembering ended ids in bounded memory is put to work
Answer = tuple[int, str, str | None, bool]  # (channel, type, error code, answers an open)


class WireChecker:
    """What the server sent, judged frame by frame with no help from the cores."""

    def __init__(self) -> None:
        self.ended: set[int] = set()  # a second `exit` is a frame after the end too
        self.credit: dict[int, int] = {}

    def feed(self, frames: list[Frame], expected: list[Answer]) -> None:
        """Judge ``frames``; the answers among them must be ``expected``, in order."""
        waiting = list(expected)
        for frame in frames:
            channel = frame.channel
            assert channel == 0 or channel not in self.ended, f"frame after the end of {channel}"
            if frame.kind in (FrameKind.STDOUT, FrameKind.STDERR):
                self.credit[channel] -= len(frame.payload)
                assert self.credit[channel] >= 0, f"channel {channel} overdrew its credit"
                continue
            assert frame.kind is FrameKind.CTRL_OUT
            message = parse_object(frame.payload)[1]
            kind = message["type"]
            if kind == "exit":
                self.ended.add(channel)
            elif kind in ("opened", "error"):
                assert waiting, f"an answer nobody asked for: {message}"
                want_channel, want_kind, want_code, answers_open = waiting.pop(0)
                assert (channel, kind, message.get("code")) == (want_channel, want_kind, want_code)
                if answers_open and kind == "error":
                    self.ended.add(channel)  # a refused open ends its channel
        assert not waiting, f"answers missing: {waiting}"


class CoresMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.server = ServerConnection(stdin_window=STDIN_WINDOW)
        self.server.channels.used.max_ranges = MAX_RANGES
        self.client = ClientConnection()
        self.checker = WireChecker()
        self.state: dict[int, str] = {}  # the model: "open" or "ended", as the server sees it
        self.unconsumed: dict[int, int] = {}
        self.batch: list[bytes] = []
        self.expected: list[Answer] = []
        self.decisions: list[bool] = []  # admit or refuse, for each valid open in the batch
        hello = self.client.hello(Hello(protocol=1, multiplex=True, window=OUTPUT_WINDOW))
        self.server.receive_data(hello)
        assert self.server.next_event() is not None
        self.server.accept_hello("model")
        self.deliver()

    # --- plumbing ---------------------------------------------------------------

    def deliver(self) -> None:
        """Server bytes to both checkers; the answers must be exactly the expected ones."""
        data = b"".join(bytes(b) for b in self.server.data_to_send())
        self.checker.feed(FrameDecoder(1 << 20).feed(data), self.expected)
        self.expected = []
        self.client.receive_data(data)
        events = iter(self.client.next_event, None)  # RemoteProtocolError if a rule was broken
        collections.deque(events, maxlen=0)

    def flush(self) -> None:
        """Feed the batch of client frames to the server, acting as the handler does."""
        self.server.receive_data(b"".join(self.batch))
        self.batch = []
        while (event := self.server.next_event()) is not None:
            if isinstance(event, OpenRequested):
                if self.decisions.pop(0):
                    self.server.opened(event.channel, Opened(pid=event.channel))
                else:
                    self.server.refuse(event.channel, RequestError(ErrorCode.BUSY, "no"))
            elif isinstance(event, StdinReceived):
                self.unconsumed[event.channel] += len(event.data)
        assert not self.decisions
        self.deliver()

    def live(self) -> list[int]:
        return sorted(ch for ch, state in self.state.items() if state == "open")

    def answer(self, channel: int, kind: str, code: str | None = None,
               answers_open: bool = False) -> None:
        self.expected.append((channel, kind, code, answers_open))

    # --- client requests (batched) ----------------------------------------------

    @rule(channel=CHANNELS, valid=st.booleans(), admit=st.booleans(), pty=st.booleans())
    def open(self, channel: int, valid: bool, admit: bool, pty: bool) -> None:
        self.flush()  # the server's memory of used ids is up to date
        if channel not in self.state and channel in self.server.channels.used:
            self.state[channel] = "ended"  # a gap filled to keep that memory bounded
        state = self.state.get(channel)
        if state is not None:  # reuse: refused on the channel while live, on 0 once ended
            self.batch.append(ctrl(channel, Open()))
            self.answer(0 if state == "ended" else channel, "error", "channel_in_use")
        elif not valid:
            self.batch.append(ctrl(channel, {"type": "open", "rows": 0}))
            self.answer(channel, "error", "bad_request", answers_open=True)
            self.state[channel] = "ended"
        else:
            self.batch.append(self.client.open(channel, Open(argv=["x"], pty=pty)))
            self.decisions.append(admit)
            self.answer(channel, "opened" if admit else "error", None if admit else "busy",
                        answers_open=True)
            self.state[channel] = "open" if admit else "ended"
            self.unconsumed[channel] = 0
            self.checker.credit[channel] = OUTPUT_WINDOW

    @rule(data=st.data())
    def unknown_message(self, data: st.DataObject) -> None:
        # On channel 0 or a live one: an answer on a channel the client never opened could
        # not be told from the refusal of an open that follows it (a server unit test
        # covers unknown types on unopened channels).
        channel = data.draw(st.sampled_from([0, *self.live()]))
        self.batch.append(ctrl(channel, {"type": "frobnicate"}))
        self.answer(channel, "error", "unknown_message")

    @rule(data=st.data(), value=st.sampled_from([0, -5, "7", 2.5, None, True, 1 << 31]))
    def bad_window(self, data: st.DataObject, value: object) -> None:
        if live := self.live():
            channel = data.draw(st.sampled_from(live))
            self.batch.append(ctrl(channel, json.dumps({"type": "window", "bytes": value})
                                   .encode()))
            self.answer(channel, "error", "bad_request")

    @rule(data=st.data(), grant=st.integers(1, 100))
    def window(self, data: st.DataObject, grant: int) -> None:
        if live := self.live():
            channel = data.draw(st.sampled_from(live))
            self.batch.append(self.client.control(channel, Window(bytes=grant)))
            self.checker.credit[channel] += grant

    @rule(data=st.data())
    def stdin(self, data: st.DataObject) -> None:
        live = [ch for ch in self.live() if self.client.stdin_credit(ch)]
        if live:
            channel = data.draw(st.sampled_from(live))
            credit = self.client.stdin_credit(channel)
            assert credit is not None
            size = data.draw(st.just(credit) | st.integers(1, credit))
            self.batch.append(self.client.stdin(channel, b"i" * size))

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        if live := self.live():
            channel = data.draw(st.sampled_from(live))
            self.batch.append(self.client.cancel(channel))
            self.state[channel] = "ended"

    @rule()
    def send_batch(self) -> None:
        self.flush()

    # --- what the sessions do (after the batch is read) ---------------------------

    @precondition(lambda self: any(s == "open" for s in self.state.values()))
    @rule(data=st.data(), stderr=st.booleans())
    def output(self, data: st.DataObject, stderr: bool) -> None:
        self.flush()
        if not (live := self.live()):
            return
        channel = data.draw(st.sampled_from(live))
        credit = self.server.output_credit(channel)
        assert credit is not None
        size = data.draw(st.sampled_from([credit, credit // 2]) | st.integers(0, credit))
        pty = self.server.channels.live[channel].pty
        kind = FrameKind.STDERR if stderr and not pty else FrameKind.STDOUT
        if size:
            assert self.server.send_output(channel, kind, b"o" * size)
        self.deliver()

    @precondition(lambda self: any(s == "open" for s in self.state.values()))
    @rule(data=st.data())
    def exit(self, data: st.DataObject) -> None:
        self.flush()
        if live := self.live():
            channel = data.draw(st.sampled_from(live))
            assert self.server.send_exit(channel, Exit(code=channel))
            self.state[channel] = "ended"
            self.deliver()

    @rule(data=st.data())
    def consume_stdin(self, data: st.DataObject) -> None:
        self.flush()
        waiting = [ch for ch in self.live() if self.unconsumed[ch]]
        if waiting:
            channel = data.draw(st.sampled_from(waiting))
            size = data.draw(st.integers(1, self.unconsumed[channel]))
            self.unconsumed[channel] -= size
            self.server.stdin_consumed(channel, size)
            self.deliver()

    # --- invariants ---------------------------------------------------------------

    @invariant()
    def memory_for_ended_ids_is_bounded_and_forgets_none(self) -> None:
        channels = self.server.channels
        assert len(channels.used) <= MAX_RANGES
        if not self.batch:
            assert sorted(channels.live) == self.live()
            assert all(channel in channels.used for channel in self.state)


CoresMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=60,
                                          deadline=None)
test_cores = CoresMachine.TestCase
