// The built-in terminal page (protocol sections 8 to 10): xterm.js on one PTY session.
// It opens the server's default command (never one from the URL), sized to the window, as a
// detachable session whose id it keeps in sessionStorage. A dropped connection (noticed by
// the heartbeat when nothing says so) reattaches at the offsets the page holds, so the screen
// goes on with nothing shown twice; a reload of the tab reattaches from a reset terminal, the
// session's prologue (its terminal modes) and its scrollback. Keys go to the session only
// through term.onData and term.onBinary, and wait in a bounded queue while there is no
// session to take them (before it opened, while it reconnects); output credit goes back from
// term.write's callback, so a flood never outruns the rendering.
import { Terminal } from "./vendor/xterm.mjs";
import { FitAddon } from "./vendor/addon-fit.mjs";
import { Connection } from "./ttyserve.js";

const WINDOW = 256 * 1024; // output in flight: what xterm.js may still have to render
const RETRIES = [250, 500, 1000, 2000, 4000]; // ms before each reattach try
const STORED = "ttyserve.session"; // sessionStorage: this tab's session, across reloads
const HEARTBEAT = 5; // seconds: a silent link is given up after three
const KEY_QUEUE = 64 * 1024; // bytes of keys kept while no session takes them
const encoder = new TextEncoder();
const body = document.body;

const term = new Terminal({ cursorBlink: true, scrollback: 10000, convertEol: false });
window.term = term;
const fit = new FitAddon();
term.loadAddon(fit);
term.open(document.getElementById("terminal"));
fit.fit();
term.focus();

const token = new URLSearchParams(location.hash.slice(1)).get("token") ?? undefined;
const scheme = location.protocol === "https:" ? "wss:" : "ws:";
const url = `${scheme}//${location.host}/ws`;
let command = "ttyserve";
let session = null; // the live one; keys and resizes go to it
let held = null; // {id, stdout, stderr}: what this page shows of its session, for a resume
const queued = []; // keys typed while no session takes them
let queuedBytes = 0;
window.ttyserve = { connection: null, session: null, queued }; // for embedders and tests

function type(bytes) {
  if (session) {
    session.send(bytes);
  } else if (queuedBytes + bytes.length <= KEY_QUEUE) {
    queued.push(bytes);
    queuedBytes += bytes.length;
  }
}

function show(state) {
  document.title = `${command} — ${state}`;
}

function finish(line, attributes) {
  // The data attributes follow the line: once they are set, the line is in the terminal.
  term.write(`\r\n${line}\r\n`, () => Object.assign(body.dataset, attributes));
}

/** One connection carrying our session, opened anew or attached to; resolves to how it
 * ended: "exit", "refused", "gone" (no such session), "lost" (the connection dropped, or a
 * refusal that may pass: busy, shutting_down) or "lost-after" (it dropped after it had
 * started: the tries start again). */
function connect(stored) {
  return new Promise((resolve) => {
    const connection = new Connection(url, {
      token, window: WINDOW, client: "ttyserve-page", multiplex: true, heartbeat: HEARTBEAT,
    });
    const size = { rows: term.rows, cols: term.cols };
    const offsets = held && held.id === stored ? held : undefined; // what the screen shows
    const current = stored
      ? connection.attach(stored, { ...size, steal: true, offsets }) // our own tab: take it back
      : connection.open({ pty: true, ...size, term: "xterm-256color", detachable: true });
    window.ttyserve = { connection, session: current, queued };
    const started = (event) => {
      session = current;
      if (event.detail.argv) command = event.detail.argv.join(" ");
      if (current.id) sessionStorage.setItem(STORED, current.id);
      body.dataset.session = "running";
      show("running");
      while (queued.length) current.send(queued.shift()); // typed while there was none
      queuedBytes = 0;
    };
    current.addEventListener("opened", started);
    current.addEventListener("attached", (event) => {
      const at = event.detail.offsets?.stdout ?? 0;
      if (!offsets || at !== offsets.stdout) {
        // A fresh screen (a reload), or one that missed output: reset, restore the modes,
        // then the scrollback that follows is the screen.
        term.write("\x1bc" + (event.detail.prologue ?? ""));
      } // else exactly where it stopped: the screen simply goes on
      started(event);
    });
    current.addEventListener("output", (event) => {
      const data = event.detail.data;
      term.write(data, () => current.consumed(data.length));
    });
    current.addEventListener("exit", (event) => {
      const exit = event.detail;
      sessionStorage.removeItem(STORED);
      session = held = null;
      const attributes = { session: "ended", exitCode: String(exit.code) };
      if (exit.signal) attributes.signal = exit.signal;
      finish(exit.signal ? `[killed by signal ${exit.signal}]` : `[exited: code ${exit.code}]`,
        attributes);
      show(exit.signal ? `killed by ${exit.signal}` : `exited ${exit.code}`);
      connection.close();
      resolve("exit");
    });
    current.addEventListener("refused", (event) => {
      if (stored && event.detail.code === "no_such_session") {
        sessionStorage.removeItem(STORED);
        resolve("gone");
      } else if (event.detail.retriable) {
        resolve("lost"); // busy, or a server going down: try again, as after a drop
      } else {
        finish(`[refused: ${event.detail.code}: ${event.detail.message}]`,
          { session: "refused" });
        show("refused");
        resolve("refused");
      }
      connection.close();
    });
    current.addEventListener("detached", (event) => {
      session = null;
      finish(`[detached${event.detail.reason ? ": " + event.detail.reason : ""}]`,
        { session: "detached" });
      show("detached");
      resolve("detached");
    });
    current.addEventListener("lost", () => {
      const after = session === current;
      if (after) {
        held = { id: current.id, ...current.offsets };
        session = null; // keys wait in the queue until it is back
      }
      resolve(after ? "lost-after" : "lost");
    });
    connection.addEventListener("error", (event) => {
      // One that may pass (server_restarting: an upgrade; shutting_down) goes to the title: the
      // page reconnects, and the screen, a full-screen program's too, stays as it was.
      if (event.detail.retriable) show(`${event.detail.code}: reconnecting`);
      else term.write(`\r\n[${event.detail.code}: ${event.detail.message}]\r\n`);
    });
  });
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function run() {
  show("connecting");
  let ended = await connect(sessionStorage.getItem(STORED));
  if (ended === "gone") ended = await connect(null); // it ended, or expired: a new one
  for (let tries = 0; ended.startsWith("lost") && sessionStorage.getItem(STORED); tries++) {
    if (ended === "lost-after") tries = 0; // it had come back: a new drop, new tries
    if (tries >= RETRIES.length) break;
    show("reconnecting");
    await sleep(RETRIES[tries]);
    ended = await connect(sessionStorage.getItem(STORED));
  }
  if (ended.startsWith("lost") || ended === "gone") {
    finish("[connection lost]", { session: "lost" });
    show("connection lost");
  }
}

term.onData((data) => type(encoder.encode(data)));
term.onBinary((data) => type(Uint8Array.from(data, (c) => c.charCodeAt(0))));
term.onResize(({ rows, cols }) => session?.resize(rows, cols));
new ResizeObserver(() => fit.fit()).observe(document.getElementById("terminal"));
run();
