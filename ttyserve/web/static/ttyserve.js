// ttyserve protocol v1 over a WebSocket (protocol section 8), as one small ES module that any
// terminal frontend can import:
//
//   import { Connection } from "/static/ttyserve.js";
//   const connection = new Connection("ws://host:7681/ws", { token, window: 262144 });
//   const session = connection.open({ pty: true, rows: 24, cols: 80 });
//   session.addEventListener("output", (e) => render(e.detail.data, () => session.consumed(e.detail.data.length)));
//   session.addEventListener("exit", (e) => console.log(e.detail.code));
//   session.send(new TextEncoder().encode("ls\r"));
//
// Events: Connection "welcome", "error" (an error on channel 0), "close"; Session "opened"
// ({pid, argv, session}), "attached" ({session, pid, pty, dropped, offsets, prologue, role}),
// "output" ({stream, data: Uint8Array}), "exit" (the exit message), "detached" (the session
// goes on without this channel: {reason}), "refused" (the error that refused the open or
// attach), "error" (a refused control message), "lost" (the connection ended before the
// exit); section 11: "audience" ({observers}: to the writer, how many watch) and "skipped"
// ({bytes, offsets}: an observer that fell behind goes on that much later); section 14:
// "modes" (the terminal's state, {echo, canonical, alt_screen, input, offset}, for an `open` or
// `attach` with `modes: true`), told in its place between the "output" events. A `grant` (from
// `ttyserve share`) stands for the token: `welcome.grant` says the one session and the role
// it may attach with (`attach(id, {role: "observer"})`). With `window`, output credit is
// granted back by `consumed(n)` once the frontend has rendered n bytes, and stdin waits for
// the server's credit. With `heartbeat` (seconds,
// section 10) the connection pings when idle and counts itself lost after three heartbeats of
// silence; a session's `offsets` (bytes received per stream) are what `attach` takes to go
// on exactly where it stopped. Connection "pong" ({ms}): the round trip of one of its pings
// (`ping()`, or the heartbeat's), a measure of this connection's latency.

export const SUBPROTOCOL = "ttyserve.v1";
export const PROTOCOL = 1;
export const Kind = Object.freeze({ STDIN: 0, STDOUT: 1, STDERR: 2, CTRL_IN: 3, CTRL_OUT: 4 });
const HEADER = 9;
const DEFAULT_MAX_FRAME = 1 << 20;
const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** One frame: kind u8, channel u32, length u32 (big-endian), payload. */
export function encodeFrame(kind, channel, payload) {
  const frame = new Uint8Array(HEADER + payload.length);
  const view = new DataView(frame.buffer);
  view.setUint8(0, kind);
  view.setUint32(1, channel);
  view.setUint32(5, payload.length);
  frame.set(payload, HEADER);
  return frame;
}

/** The frames of one binary message, which holds whole frames (section 8). */
export function decodeFrames(buffer) {
  const bytes = new Uint8Array(buffer);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const frames = [];
  let offset = 0;
  while (offset < bytes.length) {
    if (bytes.length - offset < HEADER) throw new Error("a message ended inside a frame header");
    const length = view.getUint32(offset + 5);
    const start = offset + HEADER;
    if (bytes.length - start < length) throw new Error("a message ended inside a frame");
    frames.push({
      kind: view.getUint8(offset),
      channel: view.getUint32(offset + 1),
      payload: bytes.subarray(start, start + length),
    });
    offset = start + length;
  }
  return frames;
}

/** A connection to a ttyserve server over a WebSocket. */
export class Connection extends EventTarget {
  constructor(url, {
    token, window: windowBytes, client = "ttyserve.js", multiplex = false, heartbeat, grant,
  } = {}) {
    super();
    this.window = windowBytes ?? null;
    this.heartbeat = heartbeat ?? null;
    this._lastSent = this._lastReceived = Date.now();
    this.welcome = null;
    this.closed = false;
    this.sessions = new Map();
    this._nextChannel = 1;
    this._waiting = []; // frames sent before the socket opened
    this._pings = []; // when each ping still unanswered was sent (pongs come in order)
    this.lastPing = null; // when the last ping was sent (ms, performance.now())
    this.socket = new WebSocket(url, SUBPROTOCOL);
    this.socket.binaryType = "arraybuffer";
    const hello = { type: "hello", protocol: PROTOCOL, client, multiplex };
    if (grant) hello.grant = grant;
    else if (token) hello.token = token;
    if (this.window !== null) hello.window = this.window;
    if (this.heartbeat !== null) hello.heartbeat = this.heartbeat;
    this._control(0, hello);
    if (this.heartbeat !== null) {
      this._beat = setInterval(() => this._checkHeartbeat(), this.heartbeat * 250);
    }
    this.socket.addEventListener("open", () => {
      for (const frame of this._waiting) this.socket.send(frame);
      this._waiting = [];
    });
    this.socket.addEventListener("message", (event) => this._receive(event.data));
    this.socket.addEventListener("close", (event) => this._closed(event));
  }

  get maxFrame() {
    return this.welcome?.max_frame ?? DEFAULT_MAX_FRAME;
  }

  /** Open a session (pipelined: no need to wait for `welcome`). A `detachable` one
   * outlives the connection: its "opened" event carries the id to `attach` with, and
   * `detachedTimeout` (seconds, up to the server's --detached-timeout) is how long it is kept
   * without a client. `target` runs it on that target of a door (section 15). With
   * `modes`, the session tells the terminal's state ("modes" events, section 14). */
  open({ argv, pty = true, rows, cols, term, env, cwd, detachable = false,
         detachedTimeout, target, modes = false } = {}) {
    const request = { type: "open", pty };
    if (argv) request.argv = argv;
    if (rows) request.rows = rows;
    if (cols) request.cols = cols;
    if (term) request.term = term;
    if (env) request.env = env;
    if (cwd) request.cwd = cwd;
    if (detachable) request.detachable = true;
    if (detachable && detachedTimeout) request.detached_timeout = detachedTimeout;
    if (target) request.target = target;
    if (modes) request.modes = true;
    return this._begin(request);
  }

  /** Take over a detachable session: "attached", its scrollback as output, then live output,
   * then its exit. Refused ("refused") with no_such_session, or session_in_use unless `steal`.
   * With `role: "observer"`, watch it instead: nothing sent reaches the process. With
   * `modes`, the terminal's state ("modes" events, section 14). */
  attach(session, { rows, cols, steal = false, offsets, role, modes = false } = {}) {
    const request = { type: "attach", session };
    if (role) request.role = role;
    if (rows) request.rows = rows;
    if (cols) request.cols = cols;
    if (steal) request.steal = true;
    if (offsets) request.offsets = { stdout: offsets.stdout, stderr: offsets.stderr };
    if (modes) request.modes = true;
    return this._begin(request);
  }

  /** An ended session's exit was read: the server may forget it now (section 10). */
  release(session) {
    this._control(0, { type: "release", session });
  }

  _begin(request) {
    const channel = this._nextChannel++;
    const session = new Session(this, channel);
    this.sessions.set(channel, session);
    this._control(channel, request);
    return session;
  }

  close() {
    this.socket.close(1000);
  }

  /** Sends a `ping` (section 10): its answer comes as a "pong" event with the round trip. */
  ping() {
    this._control(0, { type: "ping" });
  }

  _send(frame) {
    this._lastSent = Date.now();
    if (this.socket.readyState === WebSocket.CONNECTING) this._waiting.push(frame);
    else if (this.socket.readyState === WebSocket.OPEN) this.socket.send(frame);
  }

  _checkHeartbeat() {
    const now = Date.now();
    const interval = this.heartbeat * 1000;
    if (now - this._lastReceived >= 3 * interval) {
      // A silent link: the browser may take minutes to call it closed, so it is lost now.
      this._closed({ code: 4000, reason: "no heartbeat", wasClean: false });
      this.socket.close(4000, "no heartbeat");
    } else if (now - this._lastSent >= interval) {
      this.ping();
    }
  }

  _control(channel, message) {
    if (message.type === "ping" && channel === 0) {
      this.lastPing = performance.now();
      this._pings.push(this.lastPing);
    }
    this._send(encodeFrame(Kind.CTRL_IN, channel, encoder.encode(JSON.stringify(message))));
  }

  _receive(data) {
    if (this.closed) return;
    this._lastReceived = Date.now();
    let frames;
    try {
      if (!(data instanceof ArrayBuffer)) throw new Error("a text message");
      frames = decodeFrames(data);
    } catch (error) {
      this._broken(`the server broke the protocol: ${error.message}`);
      return;
    }
    for (const frame of frames) {
      let message = null;
      if (frame.kind === Kind.CTRL_OUT) {
        try {
          message = JSON.parse(decoder.decode(frame.payload));
        } catch (error) {
          this._broken("the server sent a control message that is not JSON");
          return;
        }
      }
      try {
        if (message !== null && frame.channel === 0) this._connectionMessage(message);
        else if (message !== null) this.sessions.get(frame.channel)?._control(message);
        else if (frame.kind === Kind.STDOUT || frame.kind === Kind.STDERR) {
          this.sessions.get(frame.channel)?._output(frame.kind, frame.payload);
        }
      } catch (error) {
        console.error(error); // a listener's bug must not lose the frames after it
      }
    }
  }

  _broken(reason) {
    this.dispatchEvent(new CustomEvent("error", { detail: { code: "protocol_error", message: reason } }));
    this.socket.close(4002, "protocol error"); // 1002 is the browser's own to send
  }

  _connectionMessage(message) {
    if (message.type === "ping") {
      this._control(0, { type: "pong" });
    } else if (message.type === "pong") {
      const sent = this._pings.shift();
      if (sent !== undefined) {
        this.dispatchEvent(new CustomEvent("pong", { detail: { ms: performance.now() - sent } }));
      }
    } else if (message.type === "welcome") {
      this.welcome = message;
      for (const session of this.sessions.values()) session._welcome(message);
      this.dispatchEvent(new CustomEvent("welcome", { detail: message }));
    } else if (message.type === "error") {
      const named = this.sessions.get(message.channel);
      if (named && message.code === "channel_in_use") named._control(message);
      else this.dispatchEvent(new CustomEvent("error", { detail: message }));
    }
  }

  _closed(event) {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this._beat);
    for (const session of this.sessions.values()) session._lost();
    this.sessions.clear();
    this.dispatchEvent(new CustomEvent("close", {
      detail: { code: event.code, reason: event.reason, clean: event.wasClean },
    }));
  }
}

/** One remote process, on one channel of a Connection. */
export class Session extends EventTarget {
  constructor(connection, channel) {
    super();
    this.connection = connection;
    this.channel = channel;
    this.pid = null;
    this.argv = null;
    this.id = null; // a detachable session's id
    this.role = "writer"; // or "observer" (section 11), as `attached` says
    this.ended = false;
    this.bytesReceived = 0; // output received, and output the frontend said it took:
    this.bytesConsumed = 0; // with a window, the difference never exceeds it
    this.offsets = { stdout: 0, stderr: 0 }; // per stream, since the session started
    this.modes = null; // the last "modes" message (section 14), with `modes: true`
    this._opened = false;
    this._consumed = 0;
    // STDIN credit: unknown (0) until `welcome` on a windowed connection, else no limit.
    this._credit = connection.window === null ? Infinity
      : connection.welcome ? (connection.welcome.window ?? Infinity) : 0;
    this._pending = []; // stdin waiting for credit
  }

  /** Bytes for the process's stdin, or keys for its terminal. */
  send(bytes) {
    // (An observer's input would reach nothing: it is not sent.)
    if (this.ended || bytes.length === 0 || this.role === "observer") return;
    this._pending.push(bytes);
    this._flush();
  }

  resize(rows, cols) {
    this._controlIn({ type: "resize", rows, cols });
  }

  signal(name) {
    this._controlIn({ type: "signal", name });
  }

  eof() {
    this._controlIn({ type: "eof" });
  }

  /** End the session; an observer cannot, so it detaches ("detached" follows). */
  cancel() {
    if (this.role === "observer") {
      this.detach();
      return;
    }
    this._controlIn({ type: "cancel" });
    this._end();
  }

  /** Leave a detachable session running; "detached" follows. */
  detach() {
    this._controlIn({ type: "detach" });
  }

  /** The frontend has taken (rendered) `size` bytes of output: credit goes back at half. */
  consumed(size) {
    const windowBytes = this.connection.window;
    this.bytesConsumed += size;
    if (windowBytes === null || this.ended) return;
    this._consumed += size;
    if (this._consumed >= windowBytes / 2) {
      this._controlIn({ type: "window", bytes: this._consumed });
      this._consumed = 0;
    }
  }

  _controlIn(message) {
    if (!this.ended) this.connection._control(this.channel, message);
  }

  _flush() {
    while (this._pending.length && this._credit > 0) {
      const head = this._pending[0];
      const size = Math.min(head.length, this._credit, this.connection.maxFrame);
      this.connection._send(encodeFrame(Kind.STDIN, this.channel, head.subarray(0, size)));
      this._credit -= size;
      if (size === head.length) this._pending.shift();
      else this._pending[0] = head.subarray(size);
    }
  }

  _welcome(welcome) {
    if (this.connection.window !== null) {
      this._credit = welcome.window ?? Infinity;
      this._flush();
    }
  }

  _output(kind, data) {
    this.bytesReceived += data.length;
    const stream = kind === Kind.STDERR ? "stderr" : "stdout";
    this.offsets[stream] += data.length;
    this.dispatchEvent(new CustomEvent("output", { detail: { stream, data } }));
  }

  _control(message) {
    if (message.type === "opened" || message.type === "attached") {
      this._opened = true;
      this.pid = message.pid;
      this.argv = message.argv ?? this.argv;
      this.id = message.session ?? null;
      this.role = message.role ?? "writer";
      if (message.type === "attached") {
        this.offsets = { stdout: message.offsets?.stdout ?? 0,
                         stderr: message.offsets?.stderr ?? 0 };
      }
      this.dispatchEvent(new CustomEvent(message.type, { detail: message }));
    } else if (message.type === "detached") {
      this._end();
      this.dispatchEvent(new CustomEvent("detached", { detail: message }));
    } else if (message.type === "window") {
      this._credit += message.bytes;
      this._flush();
    } else if (message.type === "skipped") {
      if (message.offsets) {
        this.offsets = { stdout: message.offsets.stdout ?? 0,
                         stderr: message.offsets.stderr ?? 0 };
      } else {
        this.offsets.stdout += message.bytes;
      }
      this.dispatchEvent(new CustomEvent("skipped", { detail: message }));
    } else if (message.type === "modes") {
      this.modes = message;
      this.dispatchEvent(new CustomEvent("modes", { detail: message }));
    } else if (message.type === "audience") {
      this.dispatchEvent(new CustomEvent("audience", { detail: message }));
    } else if (message.type === "exit") {
      this._end();
      // Read: the server may forget it (not an observer's to say: the writer may not have it).
      if (this.id && this.role !== "observer") this.connection.release(this.id);
      this.dispatchEvent(new CustomEvent("exit", { detail: message }));
    } else if (message.type === "error") {
      if (this._opened) {
        this.dispatchEvent(new CustomEvent("error", { detail: message }));
      } else {
        this._end();
        this.dispatchEvent(new CustomEvent("refused", { detail: message }));
      }
    }
  }

  _end() {
    this.ended = true;
    this._pending = [];
    this.connection.sessions.delete(this.channel);
  }

  _lost() {
    if (this.ended) return;
    this._end();
    this.dispatchEvent(new CustomEvent("lost"));
  }
}
