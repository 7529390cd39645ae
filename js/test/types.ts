// Checked by tsc (npm test), never run: the declarations describe how a frontend uses the
// module, and a wrong use is a type error.
import {
  Connection, decodeFrames, encodeFrame, Kind, type Exit, type Modes,
} from "../ttyserve.js";

const connection = new Connection("ws://127.0.0.1:7681/ws", { token: "t", window: 1 << 18 });
const session = connection.open({ pty: true, rows: 24, cols: 80, detachable: true,
                                  detachedTimeout: 900 });
session.addEventListener("output", (event) => {
  const bytes: Uint8Array = event.detail.data;
  session.consumed(bytes.length);
});
session.addEventListener("exit", (event) => {
  const exit: Exit = event.detail;
  const code: number = exit.code;
  const signal: string | undefined = exit.signal;
  void [code, signal];
});
session.signal("INT");
const frames = decodeFrames(encodeFrame(Kind.STDIN, 1, new Uint8Array([1])));
const kind: number = frames[0].kind;
void kind;
// @ts-expect-error: a signal the protocol does not have
session.signal("BOGUS");
const watched = connection.open({ pty: true, modes: true });
watched.addEventListener("modes", (event) => {
  const hidden: boolean = event.detail.input === "hidden";
  const alt: boolean = event.detail.alt_screen;
  void [hidden, alt, watched.modes?.offset];
});
connection.addEventListener("pong", (event) => { const ms: number = event.detail.ms; void ms; });
connection.ping();
connection.attach("id", { modes: true, role: "observer" });
// @ts-expect-error: a verdict the protocol does not have
const wrong: Modes["input"] = "shown";
void wrong;

// The predictor (predict.js), beside a terminal: its options and state are typed.
import { type Cell, Predictor } from "../predict.js";

const predictor = new Predictor({}, { mode: "auto", draw: (cells: Cell[]) => void cells });
watched.addEventListener("modes", (event) => predictor.modes(event.detail));
predictor.keyTyped("x");
predictor.roundTrip(42);
const on: boolean = predictor.state.predict === "on";
void on;
// @ts-expect-error: a mode the predictor does not have
predictor.mode = "sometimes";
