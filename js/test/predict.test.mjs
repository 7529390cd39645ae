// The predictor (ttyserve/web/static/predict.js, protocol section 14) against the terminal's
// state as xterm.js keeps it: a headless xterm.js (@xterm/headless, the vendored version)
// gets the server's output through the predictor, and a second one, the control, gets the
// same output alone. What a person sees is the first one's screen with the predictions the
// predictor draws laid over it; once every prediction is confirmed or taken back, it must
// equal the control's screen exactly.
import assert from "node:assert/strict";
import { test } from "node:test";
import { decorations, Predictor } from "../../ttyserve/web/static/predict.js";

let Terminal = null;
try {
  ({ Terminal } = (await import("@xterm/headless")).default);
} catch {
  console.log("# SKIP: @xterm/headless is not installed (npm ci in js/)");
}
const skip = Terminal ? false : "@xterm/headless is not installed (npm ci in js/)";
const COLS = 30;
const ROWS = 5;

/** Time and timers the test moves by hand. */
class Clock {
  t = 0;
  timers = [];
  now() { return this.t; }
  setTimeout(fn, ms) {
    const timer = { at: this.t + ms, fn };
    this.timers.push(timer);
    return timer;
  }
  clearTimeout(timer) { this.timers = this.timers.filter((t) => t !== timer); }
  advance(ms) {
    const end = this.t + ms;
    for (let fired = 0; ; fired++) {
      assert.ok(fired < 1000, "a timer that fires again and again");
      const due = this.timers.filter((t) => t.at <= end).sort((a, b) => a.at - b.at)[0];
      if (!due) break;
      this.clearTimeout(due);
      this.t = Math.max(this.t, due.at);
      due.fn();
    }
    this.t = end;
  }
}

const write = (term, data) => new Promise((resolve) => term.write(data, resolve));

/** The visible rows of a terminal, as text. */
function rows(term, overlay = []) {
  const buffer = term.buffer.active;
  const lines = [];
  for (let y = buffer.baseY; y < buffer.baseY + term.rows; y++) {
    const chars = [...buffer.getLine(y).translateToString(false)];
    for (const cell of overlay) if (cell.line === y) chars[cell.col] = cell.char;
    lines.push(chars.join("").trimEnd());
  }
  return lines;
}

/** A terminal with a predictor, a control terminal, and a clock. */
function setup({ mode = "always", input = "echoed", prompt = "$ " } = {}) {
  const term = new Terminal({ cols: COLS, rows: ROWS, allowProposedApi: true });
  const control = new Terminal({ cols: COLS, rows: ROWS, allowProposedApi: true });
  const clock = new Clock();
  const element = { dataset: {} };
  const drawn = [];
  const predictor = new Predictor(term, { mode, clock, element, draw: (c) => drawn.push(c) });
  const t = {
    term, control, clock, element, predictor, drawn,
    /** The server's output, to both terminals. */
    async server(data) {
      await Promise.all([new Promise((r) => predictor.write(data, r)), write(control, data)]);
    },
    type(data) { predictor.keyTyped(data); },
    /** What the person sees: the screen with the predictions drawn over it. */
    shown() { return rows(term, predictor.cells()); },
    /** The predicted characters drawn now, as one string. */
    predicted() { return predictor.cells().map((c) => c.char).join(""); },
    /** The screen is the server's output alone: nothing drawn over it, the same text,
     * cursor and attributes as the control's. */
    assertServerAlone() {
      assert.deepEqual(predictor.cells(), []);
      assert.deepEqual(drawn.at(-1) ?? [], []);
      assert.deepEqual(rows(term), rows(control));
      const [a, b] = [term.buffer.active, control.buffer.active];
      assert.deepEqual([a.cursorX, a.cursorY, a.baseY, a.length],
                       [b.cursorX, b.cursorY, b.baseY, b.length]);
      for (let y = 0; y < a.length; y++) {
        for (let x = 0; x < COLS; x++) {
          const [p, q] = [a.getLine(y).getCell(x), b.getLine(y).getCell(x)];
          assert.deepEqual([p.getChars(), p.getWidth(), p.isUnderline(), p.getFgColor()],
                           [q.getChars(), q.getWidth(), q.isUnderline(), q.getFgColor()]);
        }
      }
    },
    /** Types `first` and lets the server echo it: the run is confirmed. */
    async confirmRun(first = "e") {
      this.type(first);
      await this.server(first);
      assert.deepEqual(predictor.cells(), []);
    },
  };
  predictor.modes({ type: "modes", echo: input === "echoed", canonical: input !== "application",
    alt_screen: false, input, offset: 0 });
  return t.server(prompt).then(() => t);
}

for (const input of ["echoed", "application"]) {
  test(`${input}: keys show at once (underlined) in a confirmed run, until the echo`,
       { skip }, async () => {
    const t = await setup({ input });
    assert.equal(t.element.dataset.predict, "on");
    assert.equal(t.element.dataset.input, input);
    t.type("e"); // a session's first key: tentative, as after Enter
    assert.deepEqual(t.shown(), rows(t.control));
    await t.server("e"); // its echo confirms the run
    t.type("c");
    t.type("h");
    assert.equal(t.shown()[0], "$ ech"); // at once, before any echo
    assert.deepEqual(t.predictor.cells(), [{ line: 0, col: 3, char: "c" },
                                           { line: 0, col: 4, char: "h" }]);
    assert.equal(t.drawn.at(-1).length, 2); // handed to `draw`, which underlines them
    await t.server("c");
    assert.deepEqual(t.predictor.cells(), [{ line: 0, col: 4, char: "h" }]);
    await t.server("h");
    t.assertServerAlone();
    assert.equal(rows(t.term)[0], "$ ech");
  });
}

test("hidden: no key is ever shown", { skip }, async () => {
  const t = await setup({ input: "hidden", prompt: "Password: " });
  assert.deepEqual([t.element.dataset.predict, t.element.dataset.input], ["off", "hidden"]);
  for (const key of "hunter2") {
    t.type(key);
    t.assertServerAlone();
  }
  t.type("\r");
  await t.server("\r\n$ ");
  t.assertServerAlone();
  assert.deepEqual(t.drawn.flat(), []);
});

test("after Enter the keys stay hidden, and a password prompt never shows them", { skip },
     async () => {
  const t = await setup({ input: "application" });
  await t.confirmRun("l");
  t.type("s");
  assert.equal(t.shown()[0], "$ ls"); // the run is confirmed
  t.type("\r"); // closes it
  for (const key of "hunter2") {
    t.type(key);
    assert.equal(t.shown()[0], "$ ls"); // the s only: the keys after Enter are never drawn
    assert.equal(t.predicted(), "s");
  }
  await t.server("s\r\n"); // the echo of the command, not of the keys after it
  assert.equal(t.predicted(), "");
  await t.server("Password: "); // the prompt, before the server's `hidden`
  assert.equal(t.predicted(), "");
  t.predictor.modes({ input: "hidden", echo: false, canonical: true, alt_screen: false });
  t.type("!");
  t.clock.advance(5000);
  t.assertServerAlone();
  assert.deepEqual(t.drawn.flat().filter((c) => c.line > 0), []); // nothing ever drawn there
});

test("after Enter the next keys show once the echo confirms one of them", { skip },
     async () => {
  const t = await setup({ input: "echoed", prompt: "" }); // cat: the line discipline echoes
  await t.confirmRun("x");
  t.type("\r");
  t.type("c");
  t.type("d");
  assert.equal(t.predicted(), ""); // tentative
  await t.server("\r\n");
  assert.equal(t.predicted(), "");
  await t.server("c"); // confirms the new run: the key after it shows
  assert.deepEqual(t.predictor.cells(), [{ line: 1, col: 1, char: "d" }]);
  assert.deepEqual(t.shown().slice(0, 2), ["x", "cd"]);
  await t.server("d");
  t.assertServerAlone();
});

test("a prompt that happens to hold the typed letters confirms nothing", { skip }, async () => {
  const t = await setup({ input: "echoed" });
  await t.confirmRun("l");
  t.type("\r");
  t.type("P"); // a password that starts as the prompt does
  t.type("a");
  await t.server("\r\nPassword: "); // the letters are there, but no echo put them there
  t.type("s");
  t.type("x");
  assert.equal(t.predicted(), "");
  t.clock.advance(5000);
  t.assertServerAlone();
  assert.deepEqual(t.drawn.flat(), []);
});

test("an echo that differs takes the predictions back: the screen is the server's alone",
     { skip }, async () => {
  const t = await setup({ input: "application" });
  await t.confirmRun("e");
  t.type("cho");
  assert.equal(t.shown()[0], "$ echo");
  await t.server("C"); // a program that upper-cases what it echoes
  t.assertServerAlone();
  assert.equal(rows(t.term)[0], "$ eC");
  await t.server("HO");
  t.assertServerAlone();
});

test("one shown prediction contradicted takes every prediction back", { skip }, async () => {
  const t = await setup({ input: "echoed", prompt: "" });
  await t.confirmRun("a");
  t.type("b"); // shown, and never echoed
  t.type("\r");
  t.type("cd");
  await t.server("\r\nc"); // confirms the run after Enter: the d shows, and the b still
  assert.deepEqual(t.predictor.cells(), [{ line: 0, col: 1, char: "b" },
                                         { line: 1, col: 1, char: "d" }]);
  await t.server("D");
  t.assertServerAlone();
});

test("a change of the verdict takes predictions back; the next run is tentative", { skip },
     async () => {
  const t = await setup({ input: "application" });
  await t.confirmRun("a");
  t.type("b");
  assert.equal(t.predicted(), "b");
  t.predictor.modes({ input: "echoed", echo: true, canonical: true, alt_screen: false });
  assert.equal(t.predicted(), "");
  assert.equal(t.element.dataset.input, "echoed");
  t.type("c");
  assert.equal(t.predicted(), "");
  await t.server("b");
  t.assertServerAlone();
});

test("a prediction with no echo within max(1 s, 2 round trips) is taken back", { skip },
     async () => {
  const t = await setup({ input: "echoed" });
  await t.confirmRun("e");
  t.type("x");
  t.clock.advance(999);
  assert.equal(t.predicted(), "x");
  t.clock.advance(1);
  t.assertServerAlone();

  t.predictor.roundTrip(800); // two round trips: 1.6 s
  await t.confirmRun("y");
  t.type("z");
  t.clock.advance(1599);
  assert.equal(t.predicted(), "z");
  t.clock.advance(1);
  t.assertServerAlone();
  await t.server("z"); // a late echo: the screen is simply the server's
  t.assertServerAlone();

  // The cursor went where the key should have put it, but the key was never drawn there.
  await t.confirmRun("w");
  t.type("v");
  await t.server("\x1b[C");
  t.clock.advance(1599);
  assert.equal(t.predicted(), "v");
  t.clock.advance(1);
  t.assertServerAlone();
});

test("the alternate screen: no prediction", { skip }, async () => {
  const t = await setup({ input: "application" });
  t.predictor.modes({ input: "application", echo: false, canonical: false, alt_screen: true });
  assert.equal(t.element.dataset.predict, "off");
  for (const key of "abc") {
    t.type(key);
    await t.server(key);
  }
  t.type("d");
  assert.equal(t.predicted(), "");
  // The server's word is not the only one: while the terminal shows its alternate buffer,
  // nothing is predicted either.
  await t.server("\x1b[?1049h");
  t.predictor.modes({ input: "application", echo: false, canonical: false, alt_screen: false });
  for (const key of "efg") {
    t.type(key);
    await t.server(key);
  }
  t.type("h");
  assert.equal(t.predicted(), "");
  t.assertServerAlone();
});

test("backspace and left/right on the cursor's row", { skip }, async () => {
  const t = await setup({ input: "application" });
  await t.confirmRun("a");
  t.type("bc");
  assert.equal(t.shown()[0], "$ abc");
  t.type("\x7f"); // backspace
  assert.equal(t.shown()[0], "$ ab");
  t.type("\x1b[D"); // left
  t.type("X"); // inserted before the b
  assert.equal(t.shown()[0], "$ aXb");
  t.type("\x1bOC"); // right (application cursor keys)
  t.type("Y");
  assert.equal(t.shown()[0], "$ aXbY");
  // readline's echo of the same keys, piece by piece
  await t.server("bc");
  await t.server("\b \b");
  await t.server("\b");
  assert.equal(t.shown()[0], "$ aXbY");
  await t.server("Xb\b");
  await t.server("\x1b[C");
  await t.server("Y");
  t.assertServerAlone();
  assert.equal(rows(t.term)[0], "$ aXbY");
  t.type("\x7f");
  assert.equal(t.shown()[0], "$ aXb"); // the Y erased, the rest of the row in place
  t.type("\x1b[D");
  t.type("\x7f"); // the X erased: the b moves left
  assert.equal(t.shown()[0], "$ ab");
  await t.server("\b \b\b\bb \b\b");
  t.assertServerAlone();
  assert.equal(rows(t.term)[0], "$ ab");
});

test("echoed: an arrow closes the run (the line discipline echoes it as ^[[D)", { skip },
     async () => {
  const t = await setup({ input: "echoed" });
  await t.confirmRun("a");
  t.type("\x1b[D");
  t.type("b");
  assert.equal(t.predicted(), "");
});

test("the latency rule: auto above 30 ms, off below 20 ms; always and never", { skip },
     async () => {
  const t = await setup({ mode: "auto", input: "echoed" });
  const predict = () => t.element.dataset.predict;
  assert.equal(predict(), "off"); // nothing measured yet
  t.predictor.roundTrip(30);
  assert.equal(predict(), "off"); // not above 30
  t.type("a");
  await t.server("a");
  t.type("b");
  assert.equal(t.predicted(), "");
  await t.server("b");
  t.predictor.roundTrip(60); // smoothed: 30 + 30/8
  assert.equal(predict(), "on");
  await t.confirmRun("c");
  t.type("d");
  assert.equal(t.predicted(), "d");
  for (let i = 0; i < 40; i++) t.predictor.roundTrip(21); // between the two: stays on
  assert.equal(predict(), "on");
  assert.equal(t.predicted(), "d");
  for (let i = 0; i < 40 && predict() === "on"; i++) t.predictor.roundTrip(19);
  assert.equal(predict(), "off"); // below 20: off, and what was shown is taken back
  assert.ok(t.predictor._srtt < 20 && t.predictor._srtt > 19.5, String(t.predictor._srtt));
  assert.equal(t.predicted(), "");
  await t.server("d");
  t.assertServerAlone();

  t.predictor.mode = "always"; // fast, and yet on
  assert.equal(predict(), "on");
  await t.confirmRun("e");
  t.type("f");
  assert.equal(t.predicted(), "f");
  t.predictor.mode = "never";
  assert.equal(predict(), "off");
  assert.equal(t.predicted(), "");
  t.predictor.roundTrip(500);
  assert.equal(predict(), "off");
  t.predictor.mode = "always"; // overrides the latency rule, never the modes rule
  t.predictor.modes({ input: "hidden", echo: false, canonical: true, alt_screen: false });
  assert.deepEqual(t.predictor.state, { predict: "off", input: "hidden" });
  const events = [];
  t.predictor.addEventListener("change", (e) => events.push(e.detail));
  t.predictor.modes({ input: "echoed", echo: true, canonical: true, alt_screen: false });
  assert.deepEqual(events, [{ predict: "on", input: "echoed" }]);
});

test("a paste over 100 bytes is not predicted, and closes the run", { skip }, async () => {
  const t = await setup({ input: "echoed" });
  await t.confirmRun("a");
  t.type("b".repeat(101));
  assert.equal(t.predicted(), "");
  await t.server("b".repeat(101));
  t.type("c");
  assert.equal(t.predicted(), ""); // tentative: after the paste
  await t.server("c"); // confirms the new run
  t.type("d".repeat(10)); // 10 bytes at once: keys, each predicted
  assert.equal(t.predicted(), "d".repeat(10));
  t.type("\x1b[200~e\x1b[201~"); // a bracketed paste: escape sequences close the run
  t.type("f");
  assert.equal(t.predicted(), "d".repeat(10));
});

test("the decorations drawn: each predicted cell underlined, and gone when taken back", () => {
  const made = [];
  const marker = (line) => ({ line, disposed: false, dispose() { this.disposed = true; } });
  const terminal = {
    options: { fontFamily: "monospace", fontSize: 15, theme: { foreground: "#eee" } },
    buffer: { active: { baseY: 10, cursorY: 2 } },
    registerMarker: (offset) => marker(12 + offset),
    registerDecoration({ marker: m, x, width, layer }) {
      const decoration = { m, x, width, layer, disposed: false, element: { style: { height: "17px" } },
        onRender(fn) { fn(this.element); }, dispose() { this.disposed = true; } };
      made.push(decoration);
      return decoration;
    },
  };
  const draw = decorations(terminal);
  draw([{ line: 12, col: 3, char: "x" }, { line: 11, col: 0, char: " " }]);
  assert.deepEqual(made.map((d) => [d.m.line, d.x, d.width, d.layer, d.element.textContent]),
                   [[12, 3, 1, "top", "x"], [11, 0, 1, "top", " "]]);
  for (const d of made) {
    assert.equal(d.element.style.textDecoration, "underline");
    assert.equal(d.element.style.background, "#000000"); // hides the cell beneath
    assert.equal(d.element.style.color, "#eee");
  }
  draw([{ line: 12, col: 3, char: "x" }]);
  assert.deepEqual(made.map((d) => [d.disposed, d.m.disposed]), [[false, false], [true, true]]);
  draw([]);
  assert.equal(made.length, 2);
  assert.ok(made.every((d) => d.disposed && d.m.disposed));
});
