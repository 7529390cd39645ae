// The built-in terminal page (protocol section 8): xterm.js on one PTY session.
// It opens the server's default command (never one from the URL), sized to the window;
// keys go to the session only through term.onData and term.onBinary; output credit goes
// back from term.write's callback, so a flood never outruns the rendering.
import { Terminal } from "./vendor/xterm.mjs";
import { FitAddon } from "./vendor/addon-fit.mjs";
import { Connection } from "./ttyserve.js";

const WINDOW = 256 * 1024; // output in flight: what xterm.js may still have to render
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
const connection = new Connection(`${scheme}//${location.host}/ws`,
  { token, window: WINDOW, client: "ttyserve-page" });
const session = connection.open({ pty: true, rows: term.rows, cols: term.cols,
  term: "xterm-256color" });
let command = "ttyserve";
window.ttyserve = { connection, session }; // for embedders and tests, beside window.term

function show(state) {
  document.title = `${command} — ${state}`;
}

function finish(line, attributes) {
  // The data attributes follow the line: once they are set, the line is in the terminal.
  term.write(`\r\n${line}\r\n`, () => Object.assign(body.dataset, attributes));
}

show("connecting");
session.addEventListener("opened", (event) => {
  if (event.detail.argv) command = event.detail.argv.join(" ");
  body.dataset.session = "running";
  show("running");
});
session.addEventListener("output", (event) => {
  const data = event.detail.data;
  term.write(data, () => session.consumed(data.length));
});
session.addEventListener("exit", (event) => {
  const exit = event.detail;
  const attributes = { session: "ended", exitCode: String(exit.code) };
  if (exit.signal) attributes.signal = exit.signal;
  finish(exit.signal ? `[killed by signal ${exit.signal}]` : `[exited: code ${exit.code}]`,
    attributes);
  show(exit.signal ? `killed by ${exit.signal}` : `exited ${exit.code}`);
});
session.addEventListener("refused", (event) => {
  finish(`[refused: ${event.detail.code}: ${event.detail.message}]`, { session: "refused" });
  show("refused");
});
session.addEventListener("lost", () => {
  finish("[connection lost]", { session: "lost" });
  show("connection lost");
});
connection.addEventListener("error", (event) => {
  term.write(`\r\n[${event.detail.code}: ${event.detail.message}]\r\n`);
});

term.onData((data) => session.send(encoder.encode(data)));
term.onBinary((data) => session.send(Uint8Array.from(data, (c) => c.charCodeAt(0))));
term.onResize(({ rows, cols }) => session.resize(rows, cols));
new ResizeObserver(() => fit.fit()).observe(document.getElementById("terminal"));
