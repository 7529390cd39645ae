// The built-in terminal page (protocol sections 8 to 10): xterm.js on one PTY session.
// It opens the server's default command (never one from the URL), sized to the window, as a
// detachable session whose id it keeps in sessionStorage. A dropped connection (noticed by
// the heartbeat when nothing says so) reattaches at the offsets the page holds, so the screen
// goes on with nothing shown twice; a reload of the tab reattaches from a reset terminal, the
// session's prologue (its terminal modes) and its scrollback. Keys go to the session only
// through term.onData and term.onBinary, and wait in a bounded queue while there is no
// session to take them (before it opened, while it reconnects); output credit goes back from
// term.write's callback, so a flood never outruns the rendering.
// With `#grant=GRANT&session=ID` instead of `#token=...` (section 11, `ttyserve share`) it
// attaches that session with the grant's role, which `welcome` names: an observer's page says
// "read-only" in its title and sends no keys and no size; a revoked or expired grant turns it
// to `data-session="revoked"` (or "expired"). A writer's page shows how many watch.
// With `#target=NAME` (beside the token) the session it opens runs on that target of a door
// (`serve --targets`, section 15).
// Keys are echoed before the server does it (section 14, predict.js) only where that cannot show
// a secret: the session is asked for its `modes`, and `#predict=always|never|auto` (default
// auto: once the round trip exceeds 30 ms) sets the latency rule. `<body data-predict>` and
// `data-input` follow the predictor; while the input is hidden (a password prompt) a status in
// the corner says so.
import { Terminal } from "./vendor/xterm.mjs";
import { FitAddon } from "./vendor/addon-fit.mjs";
import { Connection } from "./ttyserve.js";
import { Predictor } from "./predict.js";

const WINDOW = 256 * 1024; // output in flight: what xterm.js may still have to render
const RETRIES = [250, 500, 1000, 2000, 4000]; // ms before each reattach try
const STORED = "ttyserve.session"; // sessionStorage: this tab's session, across reloads
const HEARTBEAT = 5; // seconds: a silent link is given up after three
const KEY_QUEUE = 64 * 1024; // bytes of keys kept while no session takes them
const KEEP = 900; // seconds a closed tab's shell is kept for a reload (section 8; #keep=)
// ms between round-trip samples while keys are typed: a ping when a key comes and the last
// ping is older. (A ping's pong measures the connection alone, never confused with output;
// an echo's delay would need each echo matched to its key, which is the predictor's guess,
// and a hidden prompt gives none. Idle, the heartbeat's pings go on sampling.)
const SAMPLE_EVERY = 2000;
const encoder = new TextEncoder();
const body = document.body;

// (allowProposedApi: the predictor draws with decorations, still proposed in xterm.js 6.)
const term = new Terminal({ cursorBlink: true, scrollback: 10000, convertEol: false,
  allowProposedApi: true });
window.term = term;
const fit = new FitAddon();
term.loadAddon(fit);
term.open(document.getElementById("terminal"));
fit.fit();
term.focus();

const fragment = new URLSearchParams(location.hash.slice(1));
const token = fragment.get("token") ?? undefined;
const grant = fragment.get("grant") ?? undefined;
const granted = grant ? fragment.get("session") : null; // the one session a grant may attach
const target = fragment.get("target") || undefined; // a door's target to open it on
// How long the session outlives a closed tab: #keep=SECONDS, up to the server's own limit
// (asked for more, it refuses, and the page asks for that limit: no detached_timeout).
let keep = /^[1-9][0-9]{0,9}$/.test(fragment.get("keep") ?? "") ? Number(fragment.get("keep"))
  : KEEP;
const predictMode = ["always", "never", "auto"].includes(fragment.get("predict"))
  ? fragment.get("predict") : "auto";
const predictor = new Predictor(term, { mode: predictMode, element: body });
Object.assign(body.dataset, predictor.state); // off, unknown: until the first `modes`
const status = document.getElementById("status");
predictor.addEventListener("change", (event) => {
  status.textContent = event.detail.input === "hidden" ? "input hidden" : "";
});
/** No session, or another one: nothing is known of its terminal (predictions taken back). */
const unknown = () => predictor.modes({});
const scheme = location.protocol === "https:" ? "wss:" : "ws:";
const url = `${scheme}//${location.host}/ws`;
let command = "ttyserve";
let session = null; // the live one; keys and resizes go to it
let held = null; // {id, stdout, stderr}: what this page shows of its session, for a resume
const queued = []; // keys typed while no session takes them
let queuedBytes = 0;
let role = grant ? "observer" : "writer"; // as `welcome` names it, for a grant: no key
// is queued for a grant's page before it knows it may type
let watching = 0; // observers of our session (its writer is told)
window.ttyserve = { connection: null, session: null, queued, predictor }; // for embedders, tests

function type(bytes) {
  if (role === "observer") return; // its keys would reach nothing: none are sent
  if (session) {
    session.send(bytes);
  } else if (queuedBytes + bytes.length <= KEY_QUEUE) {
    queued.push(bytes);
    queuedBytes += bytes.length;
  }
}

function show(state) {
  const parts = [command, ...(role === "observer" ? ["read-only"] : []), state];
  if (role === "writer" && watching) parts.push(`${watching} watching`);
  document.title = parts.join(" — ");
  body.dataset.state = state;
}

const ENDED_BY = { revoked: "access revoked", expired: "access expired" };

function refused(error, resolve) {
  finish(`[refused: ${error.code}: ${error.message}]`, { session: "refused" });
  show("refused");
  resolve("refused");
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
      token, grant, window: WINDOW, client: "ttyserve-page", multiplex: true,
      heartbeat: HEARTBEAT,
    });
    window.ttyserve = { connection, session: null, queued, predictor };
    connection.addEventListener("pong", (event) => predictor.roundTrip(event.detail.ms));
    // (A promise resolves once: a session's own end, told before this, comes first.)
    connection.addEventListener("close", () => resolve("lost"));
    if (!grant) {
      begin(connection, stored, resolve);
    } else { // the grant's role is known once `welcome` names it
      connection.addEventListener("welcome", (event) => {
        role = event.detail.grant?.role ?? "observer";
        body.dataset.role = role;
        begin(connection, stored, resolve);
      }, { once: true });
    }
    connection.addEventListener("error", (event) => {
      // One that may pass (server_restarting: an upgrade; shutting_down) goes to the title: the
      // page reconnects, and the screen, a full-screen program's too, stays as it was.
      if (event.detail.retriable) {
        show(`${event.detail.code}: reconnecting`);
      } else if (!connection.welcome) { // refused at `hello`: an expired or revoked grant
        refused(event.detail, resolve);
      } else {
        term.write(`\r\n[${event.detail.code}: ${event.detail.message}]\r\n`);
      }
    });
  });
}

/** Open our session on `connection`, or attach `stored`; `resolve` is told how it ended. */
function begin(connection, stored, resolve) {
  const size = { rows: term.rows, cols: term.cols };
  const offsets = held && held.id === stored ? held : undefined; // what the screen shows
  // Our own tab takes its session back (steal); a grant's page only its own lost channel.
  const steal = role === "writer" && (!grant || Boolean(offsets));
  const current = stored
    ? connection.attach(stored, { ...size, steal, offsets, role, modes: true })
    : connection.open({ pty: true, ...size, term: "xterm-256color", detachable: true,
      detachedTimeout: keep, target, modes: true });
  window.ttyserve.session = current;
  const started = (event) => {
    session = current;
    if (event.detail.argv) command = event.detail.argv.join(" ");
    if (current.id && !grant) sessionStorage.setItem(STORED, current.id);
    body.dataset.session = "running";
    show("running");
    connection.ping(); // the round trip, known before the first key
    while (queued.length) { // typed while there was none (never an observer's: dropped)
      const bytes = queued.shift();
      if (role === "writer") current.send(bytes);
    }
    queuedBytes = 0;
  };
  current.addEventListener("opened", started);
  current.addEventListener("attached", (event) => {
    const at = event.detail.offsets?.stdout ?? 0;
    if (!offsets || at !== offsets.stdout) {
      // A fresh screen (a reload), or one that missed output: reset, restore the modes,
      // then the scrollback that follows is the screen.
      predictor.write("\x1bc" + (event.detail.prologue ?? ""));
    } // else exactly where it stopped: the screen simply goes on
    started(event);
  });
  current.addEventListener("output", (event) => {
    const data = event.detail.data;
    predictor.write(data, () => current.consumed(data.length));
  });
  current.addEventListener("modes", (event) => predictor.modes(event.detail));
  current.addEventListener("audience", (event) => {
    watching = event.detail.observers;
    body.dataset.observers = String(watching);
    show(body.dataset.state ?? "running");
  });
  current.addEventListener("exit", (event) => {
    const exit = event.detail;
    if (!grant) sessionStorage.removeItem(STORED);
    session = held = null;
    unknown();
    const attributes = { session: "ended", exitCode: String(exit.code) };
    if (exit.signal) attributes.signal = exit.signal;
    finish(exit.signal ? `[killed by signal ${exit.signal}]` : `[exited: code ${exit.code}]`,
      attributes);
    show(exit.signal ? `killed by ${exit.signal}` : `exited ${exit.code}`);
    connection.close();
    resolve("exit");
  });
  current.addEventListener("refused", (event) => {
    if (!stored && keep && event.detail.code === "bad_request"
        && event.detail.message.includes("detached_timeout")) {
      keep = undefined; // over the server's limit: the limit it is
      resolve("gone");
    } else if (stored && event.detail.code === "no_such_session") {
      if (!grant) sessionStorage.removeItem(STORED);
      resolve("gone");
    } else if (event.detail.retriable) {
      resolve("lost"); // busy, or a server going down: try again, as after a drop
    } else {
      refused(event.detail, resolve);
    }
    connection.close();
  });
  current.addEventListener("detached", (event) => {
    session = null;
    unknown();
    const reason = event.detail.reason;
    if (ENDED_BY[reason]) { // the grant ended: this page may watch no more
      finish(`[${ENDED_BY[reason]}]`, { session: reason });
      show(ENDED_BY[reason]);
      connection.close();
    } else {
      finish(`[detached${reason ? ": " + reason : ""}]`, { session: "detached" });
      show("detached");
    }
    resolve("detached");
  });
  current.addEventListener("lost", () => {
    const after = session === current;
    if (after) {
      held = { id: current.id, ...current.offsets };
      session = null; // keys wait in the queue until it is back
    }
    unknown(); // told again by the next channel's first `modes`
    resolve(after ? "lost-after" : "lost");
  });
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** The session to attach: the grant's, or this tab's own (none: open one). */
const ours = () => granted ?? sessionStorage.getItem(STORED);

async function run() {
  show("connecting");
  let ended = await connect(ours());
  if (ended === "gone" && !grant) ended = await connect(null); // it ended, or expired: anew
  if (ended === "gone" && !grant && !ours()) ended = await connect(null); // (its keep refused)
  for (let tries = 0; ended.startsWith("lost") && ours(); tries++) {
    if (ended === "lost-after") tries = 0; // it had come back: a new drop, new tries
    if (tries >= RETRIES.length) break;
    show("reconnecting");
    await sleep(RETRIES[tries]);
    ended = await connect(ours());
  }
  if (ended === "gone" && grant) {
    finish("[the shared session is gone]", { session: "gone" });
    show("gone");
  } else if (ended.startsWith("lost") || ended === "gone") {
    finish("[connection lost]", { session: "lost" });
    show("connection lost");
  }
}

term.onData((data) => {
  if (role === "writer") {
    predictor.keyTyped(data);
    const connection = window.ttyserve.connection;
    if (session && performance.now() - (connection.lastPing ?? 0) > SAMPLE_EVERY) {
      connection.ping();
    }
  }
  type(encoder.encode(data));
});
term.onBinary((data) => {
  predictor.keyTyped("\x1b"); // a mouse report: a key never predicted, which closes the run
  type(Uint8Array.from(data, (c) => c.charCodeAt(0)));
});
term.onResize(({ rows, cols }) => { if (role === "writer") session?.resize(rows, cols); });
new ResizeObserver(() => fit.fit()).observe(document.getElementById("terminal"));
run();
