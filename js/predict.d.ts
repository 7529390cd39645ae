// Types of predict.js (the page's echo predictor, protocol-v1 section 14), for any
// xterm.js frontend beside ttyserve.js. The module is served at /static/predict.js too.

/** A predicted cell to draw underlined: `line` indexes the terminal's active buffer. */
export interface Cell {
  line: number;
  col: number;
  char: string;
}

/** Time and timers (tests give their own). */
export interface Clock {
  now(): number;
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(id: unknown): void;
}

export type PredictMode = "auto" | "always" | "never";

/** Whether keys are predicted now, and the server's verdict ("unknown" before any). */
export interface PredictState {
  predict: "on" | "off";
  input: "echoed" | "application" | "hidden" | "unknown";
}

/** A `modes` message (protocol-v1 section 14), as ttyserve.js dispatches it. */
export interface ModesLike {
  input: string;
  alt_screen: boolean;
}

export interface PredictorOptions {
  /** The latency rule: "auto" (default) predicts once the round trip exceeds 30 ms. */
  mode?: PredictMode;
  /** Draws the predictions to show; default: xterm.js decorations. */
  draw?: (cells: Cell[]) => void;
  /** Gets `data-predict` and `data-input` (the page's body). */
  element?: { dataset: object };
  clock?: Clock;
}

/** Predicts the echo of typed keys over an xterm.js Terminal, only where that cannot
 * show a secret; its "change" event's detail is the new `state`. */
export declare class Predictor extends EventTarget {
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  constructor(terminal: any, options?: PredictorOptions);
  mode: PredictMode;
  readonly state: PredictState;
  /** The predictions shown now. */
  cells(): Cell[];
  /** The server's `modes` message. */
  modes(message: ModesLike): void;
  /** A round-trip sample, in milliseconds. */
  roundTrip(ms: number): void;
  /** Keys about to be sent to the session (call before sending them). */
  keyTyped(data: string | Uint8Array): void;
  /** The server's output, written to the terminal and checked against the predictions. */
  write(data: string | Uint8Array, done?: () => void): void;
  /** For a frontend that writes to the terminal itself: check once it has. */
  output(): void;
  /** Take every prediction back and stop. */
  dispose(): void;
}

/** The default drawing: each cell a decoration on the top layer, underlined. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export declare function decorations(terminal: any): (cells: Cell[]) => void;
