// Types of ttyserve.js: the ttyserve protocol v1 over a WebSocket (protocol section 8).

export declare const SUBPROTOCOL: "ttyserve.v1";
export declare const PROTOCOL: 1;
export declare const Kind: Readonly<{ STDIN: 0; STDOUT: 1; STDERR: 2; CTRL_IN: 3; CTRL_OUT: 4 }>;
export type FrameKind = (typeof Kind)[keyof typeof Kind];

export interface Frame {
  kind: number;
  channel: number;
  payload: Uint8Array;
}

/** One frame: kind u8, channel u32, length u32 (big-endian), payload. */
export declare function encodeFrame(kind: number, channel: number, payload: Uint8Array): Uint8Array;
/** The frames of one binary message, which holds whole frames; throws on a cut frame. */
export declare function decodeFrames(buffer: ArrayBuffer | Uint8Array): Frame[];

export type Role = "writer" | "observer";
export type SignalName =
  | "INT" | "TERM" | "KILL" | "HUP" | "QUIT" | "USR1" | "USR2"
  | "WINCH" | "CONT" | "STOP" | "TSTP" | "ALRM" | "PIPE";

export interface Offsets {
  stdout: number;
  stderr: number;
}

export interface ConnectionOptions {
  /** The server's token (sent in `hello`). */
  token?: string;
  /** A grant from `ttyserve share`, instead of the token (section 11). */
  grant?: string;
  /** Output credit in bytes: the server sends no more than this unconsumed. */
  window?: number;
  /** The client's name in `hello`. */
  client?: string;
  multiplex?: boolean;
  /** Seconds between pings; three silent ones and the connection is lost (section 10). */
  heartbeat?: number;
}

export interface OpenOptions {
  argv?: string[];
  pty?: boolean;
  rows?: number;
  cols?: number;
  term?: string;
  env?: Record<string, string>;
  cwd?: string;
  /** The session outlives the connection; "opened" carries its id. */
  detachable?: boolean;
  /** Seconds a detachable session is kept without a client (up to the server's limit). */
  detachedTimeout?: number;
  /** Run it on this target of a door (`serve --targets`, protocol section 15). */
  target?: string;
  /** Tell the terminal's state: "modes" events (a PTY session; protocol section 14). */
  modes?: boolean;
}

export interface AttachOptions {
  rows?: number;
  cols?: number;
  steal?: boolean;
  /** The bytes already held per stream: the output goes on from there. */
  offsets?: Offsets;
  role?: Role;
  /** Tell the terminal's state: "modes" events (protocol section 14). */
  modes?: boolean;
}

export interface Welcome {
  type: "welcome";
  protocol: number;
  max_frame?: number;
  window?: number;
  grant?: { session: string; role: Role } | null;
  [member: string]: unknown;
}

export interface ErrorMessage {
  type: "error";
  code: string;
  message: string;
  retriable?: boolean;
  errno?: number;
  retry_after_ms?: number;
}

export interface Opened {
  type: "opened";
  pid: number;
  argv?: string[];
  session?: string;
  /** The door's target it runs on (section 15). */
  target?: string;
}

export interface Attached {
  type: "attached";
  session: string;
  pid: number;
  pty: boolean;
  dropped?: number;
  offsets?: Offsets;
  prologue?: string;
  role?: Role;
}

export interface Exit {
  type: "exit";
  /** The exit status, or -N for a death by signal N, or -1 with `error`. */
  code: number;
  signal?: string;
  core_dumped?: boolean;
  error?: string;
}

export interface Detached {
  type: "detached";
  reason?: "stolen" | "revoked" | "expired" | string;
}

/** The terminal's state (protocol section 14): once before any output, then at each change,
 * in its place between the output. */
export interface Modes {
  type: "modes";
  /** The terminal's ECHO flag, as the program set it. */
  echo: boolean;
  /** The terminal's ICANON flag. */
  canonical: boolean;
  /** The program's output is on the alternate screen. */
  alt_screen: boolean;
  /** The verdict for a frontend: `hidden` is a secret being typed (never show it). */
  input: "echoed" | "application" | "hidden";
  /** The STDOUT offset from which this state holds. */
  offset: number;
}

export interface Output {
  stream: "stdout" | "stderr";
  data: Uint8Array;
}

export interface ConnectionEventMap {
  welcome: CustomEvent<Welcome>;
  error: CustomEvent<ErrorMessage>;
  close: CustomEvent<{ code: number; reason: string; clean: boolean }>;
  /** A ping's answer: the round trip in ms. */
  pong: CustomEvent<{ ms: number }>;
}

export interface SessionEventMap {
  opened: CustomEvent<Opened>;
  attached: CustomEvent<Attached>;
  output: CustomEvent<Output>;
  exit: CustomEvent<Exit>;
  detached: CustomEvent<Detached>;
  refused: CustomEvent<ErrorMessage>;
  error: CustomEvent<ErrorMessage>;
  lost: Event;
  audience: CustomEvent<{ type: "audience"; observers: number }>;
  skipped: CustomEvent<{ type: "skipped"; bytes: number; offsets?: Offsets }>;
  modes: CustomEvent<Modes>;
}

/** A connection to a ttyserve server over a WebSocket. */
export declare class Connection extends EventTarget {
  constructor(url: string, options?: ConnectionOptions);
  readonly window: number | null;
  readonly heartbeat: number | null;
  welcome: Welcome | null;
  closed: boolean;
  readonly socket: WebSocket;
  readonly sessions: Map<number, Session>;
  readonly maxFrame: number;
  /** When the last ping was sent (performance.now()), or null. */
  lastPing: number | null;
  /** Open a session (pipelined: no need to wait for `welcome`). */
  open(options?: OpenOptions): Session;
  /** Take over a detachable session, or watch it (`role: "observer"`). */
  attach(session: string, options?: AttachOptions): Session;
  /** An ended session's exit was read: the server may forget it now. */
  release(session: string): void;
  /** Sends a ping; its answer is a "pong" event with the round trip. */
  ping(): void;
  close(): void;
  addEventListener<K extends keyof ConnectionEventMap>(
    type: K, listener: (event: ConnectionEventMap[K]) => void,
    options?: boolean | AddEventListenerOptions): void;
  addEventListener(type: string, listener: EventListenerOrEventListenerObject | null,
    options?: boolean | AddEventListenerOptions): void;
}

/** One remote process, on one channel of a Connection. */
export declare class Session extends EventTarget {
  readonly connection: Connection;
  readonly channel: number;
  pid: number | null;
  argv: string[] | null;
  /** A detachable session's id (for `attach`). */
  id: string | null;
  role: Role;
  ended: boolean;
  bytesReceived: number;
  bytesConsumed: number;
  /** Per stream, the output received since the session started (what `attach` takes). */
  offsets: Offsets;
  /** The last "modes" message, for a session opened or attached with `modes: true`. */
  modes: Modes | null;
  /** Bytes for the process's stdin, or keys for its terminal. */
  send(bytes: Uint8Array): void;
  resize(rows: number, cols: number): void;
  signal(name: SignalName): void;
  eof(): void;
  /** End the session; an observer cannot, so it detaches. */
  cancel(): void;
  /** Leave a detachable session running; "detached" follows. */
  detach(): void;
  /** The frontend has taken (rendered) `size` bytes of output: credit goes back. */
  consumed(size: number): void;
  addEventListener<K extends keyof SessionEventMap>(
    type: K, listener: (event: SessionEventMap[K]) => void,
    options?: boolean | AddEventListenerOptions): void;
  addEventListener(type: string, listener: EventListenerOrEventListenerObject | null,
    options?: boolean | AddEventListenerOptions): void;
}
