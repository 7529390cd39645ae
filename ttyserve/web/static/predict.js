// Local echo, predicted safely (protocol section 14, "The page"): an ES module any xterm.js
// frontend can load beside /static/ttyserve.js. It shows a typed key before the server's
// echo comes back, as mosh does, and only where that cannot show a secret:
//
//   import { Predictor } from "/static/predict.js";
//   const predictor = new Predictor(term, { mode: "auto", element: document.body });
//   term.onData((data) => { predictor.keyTyped(data); session.send(encode(data)); });
//   session.addEventListener("output", (e) =>              // the server's output, in order
//     predictor.write(e.detail.data, () => session.consumed(e.detail.data.length)));
//   session.addEventListener("modes", (e) => predictor.modes(e.detail));
//   // and a round-trip sample whenever one is measured (a ping's pong):
//   predictor.roundTrip(ms);
//
// Why an overlay. The predictor never writes into the terminal: the terminal's buffer holds
// exactly what the server's output made it, always. Predictions live in this module, keyed by
// buffer line (a marker, so they follow scrolling) and column, and are drawn over the screen
// as xterm.js decorations (or by a `draw` function of the frontend's own). Taking a
// prediction back is dropping it from that layer, so the screen after is, by construction,
// the screen without prediction. Writing guesses into the buffer and undoing them could not
// promise that: no escape sequence restores a cell's every attribute, a wide character's
// halves, a line's wrap flag or the cursor's pending wrap, and the server's output would be
// parsed on top of a cursor the guesses had moved.
//
// The rules (mosh's src/frontend/terminaloverlay.cc is the model; this is not its code):
// - Predictions are made only while the server's verdict is `echoed` or `application`, the
//   program is not on the alternate screen (by the server's word and by the terminal's
//   active buffer), and the latency rule allows it: `mode` "always", or "auto" once the
//   smoothed round trip exceeds 30 ms (off again below 20 ms; mosh's SRTT triggers). When
//   they stop being allowed, every prediction is taken back.
// - Printable characters, backspace and (in `application`: the line discipline echoes an
//   arrow as "^[[D" in `echoed`) left/right are predicted on the cursor's row. Any other key
//   (Enter, a control key, an escape sequence, a paste over 100 bytes, a character not
//   surely one cell wide, the row's last column) closes the run: the keys after it belong to
//   a new epoch, tentative, drawn only once the server's echo has confirmed one of them. The
//   first run (a session's start) is tentative too: the first thing the program prints may
//   be a password prompt, and no `modes` message can vouch for keys the program has not
//   read yet (a shell turns ECHO on for the command it starts, which may turn it off again).
// - An echo confirms an epoch when the predicted character appears where it was predicted,
//   was not there before, and the server's cursor stands right after it (as an echo leaves
//   it; a prompt that happens to hold the same letters does not). A prediction is taken
//   back when the server's output puts anything else in its cell (a shown one takes all back,
//   a tentative one its epoch and the later ones), or when it is not confirmed within
//   max(1 s, 2 round trips).

const HIGH = 30; // ms: predictions start above this smoothed round trip (mosh: SRTT_TRIGGER_HIGH)
const LOW = 20; // ms: and stop below this one (mosh: SRTT_TRIGGER_LOW)
const PASTE = 100; // bytes: input longer than this at once is a paste, never predicted
const TIMEOUT = 1000; // ms: the least time a prediction waits for its echo (section 14)
const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** One key of `data`: a whole escape sequence, or one code point. */
const KEY = /\x1b(?:\[[0-?]*[ -/]*[@-~]|O[\s\S]|[\s\S])?|[\s\S]/gu;

/** Surely one cell wide in xterm.js: ASCII and Latin-1/Extended-A/B/IPA letters (no soft
 * hyphen). Anything wider, narrower or unknown closes the run instead of being guessed. */
const narrow = (c) => (c >= 0x20 && c < 0x7f) || (c >= 0xa0 && c < 0x300 && c !== 0xad);

/**
 * @typedef {{line: number, col: number, char: string}} Cell
 *   A predicted cell to draw, underlined: `line` is an index into the terminal's active
 *   buffer (as `IMarker.line`), `char` what the key will put there (" " for an erased cell).
 * @typedef {{now(): number, setTimeout(fn: () => void, ms: number): any,
 *   clearTimeout(id: any): void}} Clock
 */

/**
 * Predicts the echo of typed keys over an xterm.js `Terminal` (or `@xterm/headless`).
 * Events: "change" ({predict: "on"|"off", input: "echoed"|"application"|"hidden"|"unknown"})
 * whenever either changes; with `element`, its `data-predict` and `data-input` follow them.
 */
export class Predictor extends EventTarget {
  /**
   * @param {any} terminal the xterm.js Terminal whose screen the server's output draws
   * @param {object} [options]
   * @param {"auto"|"always"|"never"} [options.mode] the latency rule: "auto" (default)
   *   predicts once the round trip exceeds 30 ms; it never overrides the modes rule
   * @param {(cells: Cell[]) => void} [options.draw] draws the predictions to show (called
   *   with all of them at every change); default: xterm.js decorations where the terminal
   *   has them (`decorations(terminal)`), else nothing
   * @param {{dataset: object}} [options.element] gets `data-predict` and `data-input`
   * @param {Clock} [options.clock] time and timers (tests); default: the global ones
   */
  constructor(terminal, { mode = "auto", draw, element, clock } = {}) {
    super();
    this.terminal = terminal;
    this.element = element ?? null;
    this._clock = clock ?? { now: () => performance.now(), setTimeout: (f, ms) => setTimeout(f, ms),
      clearTimeout: (id) => clearTimeout(id) };
    this._draw = draw ?? (typeof terminal.registerDecoration === "function"
      ? decorations(terminal) : () => {});
    this._mode = "auto";
    this._input = null; // the server's verdict; unknown until its first `modes`
    this._alt = null;
    this._srtt = null; // ms, smoothed as TCP does (RFC 6298: 1/8 of each new sample)
    this._slow = false; // the latency rule's verdict, with hysteresis
    this._epoch = 1; // the epoch new predictions join
    this._confirmed = 0; // epochs up to this one are shown: the first run starts tentative
    this._cells = new Map(); // "dline:col" -> {dline, col, values, epoch, credit, deadline}
    this._cursor = []; // where the cursor goes, key by key: [{dline, col, deadline}], [0] = server's
    this._anchor = null; // a marker: predictions' lines are counted from it (dline)
    this._timer = null;
    this._shown = "";
    this._state = { predict: "off", input: "unknown" };
    this._subscriptions = [terminal.onResize?.(() => this._takeBack()),
      terminal.buffer?.onBufferChange?.(() => this._takeBack())].filter(Boolean);
    this.mode = mode;
  }

  /** "auto", "always" or "never": the latency rule (never the modes rule). */
  get mode() { return this._mode; }

  set mode(mode) {
    if (!["auto", "always", "never"].includes(mode)) throw new TypeError(`no predict mode ${mode}`);
    this._mode = mode;
    this._update();
  }

  /** Whether keys are predicted now: {predict: "on"|"off", input: the verdict or "unknown"}. */
  get state() { return { ...this._state }; }

  /** The predictions shown now (what `draw` was last given). @returns {Cell[]} */
  cells() {
    const buffer = this.terminal.buffer.active;
    const shown = [];
    if (!this._anchor || this._anchor.isDisposed) return shown;
    for (const cell of this._cells.values()) {
      const line = this._anchor.line + cell.dline;
      const char = cell.values[cell.values.length - 1];
      if (cell.epoch <= this._confirmed && line < buffer.length
          && char !== this._server(line, cell.col)) shown.push({ line, col: cell.col, char });
    }
    return shown;
  }

  /** A `modes` message from the server (section 14). It holds for the keys typed from now
   * on, so it applies at once (its `offset` places it in the output, which the screen and
   * so the predictions already follow); any change of the verdict takes predictions back.
   * @param {{input: string, alt_screen: boolean}} message */
  modes(message) {
    const input = ["echoed", "application", "hidden"].includes(message.input)
      ? message.input : null;
    const alt = message.alt_screen !== false;
    if (input !== this._input || alt !== this._alt) this._takeBack();
    this._input = input;
    this._alt = alt;
    this._update();
  }

  /** A round trip measured on this connection, in ms. */
  roundTrip(ms) {
    if (!(ms >= 0)) return;
    this._srtt = this._srtt === null ? ms : this._srtt + (ms - this._srtt) / 8;
    if (this._srtt > HIGH) this._slow = true;
    else if (this._srtt < LOW) this._slow = false;
    this._update();
  }

  /** The keys just typed (what `term.onData` gives), before they are sent: predicted where
   * the rules allow. @param {string | Uint8Array} data */
  keyTyped(data) {
    const text = typeof data === "string" ? data : decoder.decode(data);
    if (this._state.predict !== "on" || encoder.encode(text).length > PASTE) {
      this._close(); // never shown: and the run after it starts tentative
      return;
    }
    for (const [key] of text.matchAll(KEY)) this._key(key);
    this._schedule();
    this._redraw();
  }

  /** Writes the server's output to the terminal, then checks the predictions against it;
   * `done` is called once the terminal has parsed it (as `term.write`'s callback).
   * @param {string | Uint8Array} data @param {() => void} [done] */
  write(data, done) {
    this.terminal.write(data, () => {
      this.output();
      done?.();
    });
  }

  /** Checks the predictions against the screen: call it once the terminal has parsed the
   * server's output (in `term.write`'s callback), if the output is not written by `write`. */
  output() {
    this._cull();
    this._schedule();
    this._redraw();
  }

  /** Takes every prediction back and stops listening to the terminal. */
  dispose() {
    this._takeBack();
    for (const subscription of this._subscriptions) subscription.dispose();
    this._subscriptions = [];
  }

  // -- the rules

  _update() {
    const verdict = (this._input === "echoed" || this._input === "application")
      && this._alt === false;
    const latency = this._mode === "always" || (this._mode === "auto" && this._slow);
    const predict = verdict && latency ? "on" : "off";
    const input = this._input ?? "unknown";
    if (predict === "off") this._takeBack();
    if (predict === this._state.predict && input === this._state.input) return;
    this._state = { predict, input };
    if (this.element) Object.assign(this.element.dataset, this._state);
    this.dispatchEvent(new CustomEvent("change", { detail: this.state }));
  }

  _key(key) {
    const buffer = this.terminal.buffer.active;
    if (buffer.type === "alternate") return this._close();
    const application = this._input === "application";
    const at = this._position();
    if (!at) return this._close();
    const { line, col } = at;
    const cols = this.terminal.cols;
    const last = key.codePointAt(0);
    if (key.length <= 2 && [...key].length === 1 && narrow(last)) { // a printable character
      if (col >= cols - 1 || !this._narrowRow(line, col)) return this._close();
      if (application) { // readline and the like insert: the rest of the row moves right
        for (let i = cols - 2; i > col; i--) this._predict(line, i, this._value(line, i - 1), false);
      }
      this._predict(line, col, key, true);
      this._move(line, col + 1);
    } else if (key === "\x7f") { // backspace
      if (col === 0 || !this._narrowRow(line, col - 1)) return this._close();
      if (application) {
        for (let i = col - 1; i < cols - 1; i++) this._predict(line, i, this._value(line, i + 1), false);
      } else { // the line discipline's ECHOE: "\b \b"
        this._predict(line, col - 1, " ", false);
      }
      this._move(line, col - 1);
    } else if (application && /^\x1b[[O]D$/.test(key) && col > 0) {
      this._move(line, col - 1);
    } else if (application && /^\x1b[[O]C$/.test(key) && col < cols - 1) {
      this._move(line, col + 1);
    } else if (key === "\r") { // Enter: its echo goes to the next line's start, tentatively
      this._epoch++;
      this._move(line + 1, 0);
    } else {
      this._close();
    }
  }

  /** Closes the run: the keys after this one are tentative, and placed from the server's
   * cursor once it has caught up (nobody knows where this key leaves it). */
  _close() {
    this._epoch++;
    this._cursor = [];
  }

  /** Where the next key goes: the last predicted cursor, else the server's once no earlier
   * key is still on its way (the server's cursor is behind those); null: not known. */
  _position() {
    const buffer = this.terminal.buffer.active;
    if (!this._cursor.length) {
      if (this._cells.size) return null;
      const line = buffer.baseY + buffer.cursorY;
      if (!this._anchor || this._anchor.isDisposed) {
        this._anchor = this.terminal.registerMarker(0);
        if (!this._anchor) return null;
      }
      this._cursor.push({ dline: line - this._anchor.line, col: buffer.cursorX, deadline: 0 });
    }
    const at = this._cursor[this._cursor.length - 1];
    return { line: this._anchor.line + at.dline, col: at.col };
  }

  _move(line, col) {
    this._cursor.push({ dline: line - this._anchor.line, col, deadline: this._deadline() });
  }

  _predict(line, col, char, credit) {
    const key = `${line - this._anchor.line}:${col}`;
    const cell = this._cells.get(key)
      ?? { dline: line - this._anchor.line, col, values: [this._server(line, col)] };
    cell.values.push(char);
    cell.epoch = this._epoch;
    cell.credit = credit;
    cell.deadline = this._deadline();
    this._cells.delete(key); // (re)inserted last: cells are checked in the order typed
    this._cells.set(key, cell);
  }

  /** Checks each prediction against the screen the server's output made (mosh's cull). */
  _cull() {
    if (!this._cells.size && !this._cursor.length) return;
    if (!this._anchor || this._anchor.isDisposed) return this._takeBack();
    const now = this._clock.now();
    const buffer = this.terminal.buffer.active;
    const cursorLine = buffer.baseY + buffer.cursorY;
    for (const [key, cell] of this._cells) {
      if (!this._cells.has(key)) continue; // its epoch was killed in this loop
      const line = this._anchor.line + cell.dline;
      const seen = this._server(line, cell.col);
      const want = cell.values[cell.values.length - 1];
      if (seen === want) { // echoed: credit only for an echo that could not be a coincidence
        if (cell.credit && cell.values.indexOf(want) === cell.values.length - 1
            && cursorLine === line && buffer.cursorX === cell.col + 1) {
          this._confirmed = Math.max(this._confirmed, cell.epoch);
        }
        this._cells.delete(key);
      } else if (!cell.values.includes(seen) || now >= cell.deadline) { // contradicted, or late
        if (cell.epoch <= this._confirmed) return this._takeBack();
        for (const [other, later] of this._cells) {
          if (later.epoch >= cell.epoch) this._cells.delete(other);
        }
        this._close();
      } // else the server has not drawn this key yet
    }
    // The cursor: drop the moves the server has made; one it never makes takes all back.
    const at = this._cursor.findLastIndex((p) =>
      this._anchor.line + p.dline === cursorLine && p.col === buffer.cursorX);
    if (at === this._cursor.length - 1) this._cursor = [];
    else if (at > 0) this._cursor.splice(0, at);
    else if (this._cursor.length && now >= this._cursor[this._cursor.length - 1].deadline) {
      return this._takeBack();
    }
    if (!this._cells.size && !this._cursor.length) this._dropAnchor();
  }

  /** Every prediction taken back; the next run starts tentative. */
  _takeBack() {
    this._cells.clear();
    this._close();
    this._dropAnchor();
    this._schedule();
    this._redraw();
  }

  // -- helpers

  _dropAnchor() {
    this._anchor?.dispose();
    this._anchor = null;
  }

  _deadline() {
    return this._clock.now() + Math.max(TIMEOUT, 2 * (this._srtt ?? 0));
  }

  /** The server's character in a cell: " " for an empty one, "" for a wide one's half. */
  _server(line, col) {
    const cell = this.terminal.buffer.active.getLine(line)?.getCell(col);
    if (!cell) return " ";
    return cell.getWidth() === 0 ? "" : cell.getChars() || " ";
  }

  /** The predicted character in a cell, else the server's. */
  _value(line, col) {
    const cell = this._cells.get(`${line - this._anchor.line}:${col}`);
    return cell ? cell.values[cell.values.length - 1] : this._server(line, col);
  }

  /** Whether every cell of the row from `col` on is one cell wide (shifting a wide
   * character's halves is not guessed). */
  _narrowRow(line, col) {
    const row = this.terminal.buffer.active.getLine(line);
    for (let i = col; row && i < this.terminal.cols; i++) {
      if (row.getCell(i)?.getWidth() !== 1) return false;
    }
    return true;
  }

  _schedule() {
    if (this._timer !== null) this._clock.clearTimeout(this._timer);
    this._timer = null;
    const deadlines = [...this._cells.values(), ...this._cursor.slice(1)].map((p) => p.deadline);
    if (!deadlines.length) return;
    const wait = Math.max(0, Math.min(...deadlines) - this._clock.now());
    this._timer = this._clock.setTimeout(() => {
      this._timer = null;
      this.output();
    }, wait);
  }

  _redraw() {
    const cells = this.cells();
    const shown = JSON.stringify(cells);
    if (shown === this._shown) return;
    this._shown = shown;
    this._draw(cells);
  }
}

/**
 * The default drawing for a browser xterm.js Terminal: each predicted cell a decoration on
 * the top layer, holding the character underlined over the terminal's own background.
 * @param {any} terminal @returns {(cells: Cell[]) => void}
 */
export function decorations(terminal) {
  const drawn = new Map(); // "line:col:char" -> {marker, decoration}
  return (cells) => {
    const wanted = new Set();
    const buffer = terminal.buffer.active;
    for (const { line, col, char } of cells) {
      const key = `${line}:${col}:${char}`;
      wanted.add(key);
      if (drawn.has(key)) continue;
      const marker = terminal.registerMarker(line - (buffer.baseY + buffer.cursorY));
      const decoration = marker && terminal.registerDecoration({ marker, x: col, width: 1,
        layer: "top" });
      if (!decoration) {
        marker?.dispose();
        continue;
      }
      decoration.onRender((element) => {
        const { fontFamily, fontSize, theme = {} } = terminal.options;
        element.textContent = char;
        Object.assign(element.style, {
          fontFamily, fontSize: `${fontSize}px`, lineHeight: element.style.height,
          whiteSpace: "pre", textAlign: "center", textDecoration: "underline",
          color: theme.foreground ?? "#ffffff", background: theme.background ?? "#000000",
        });
      });
      drawn.set(key, { marker, decoration });
    }
    for (const [key, { marker, decoration }] of drawn) {
      if (wanted.has(key)) continue;
      decoration.dispose();
      marker.dispose();
      drawn.delete(key);
    }
  };
}
