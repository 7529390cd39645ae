// The module's own tests under Node's test runner: frames, and a session against a real
// server (TTYSERVE_TEST_SERVER=ws://HOST:PORT/ws with TTYSERVE_TEST_TOKEN, which the
// repository's test suite starts; without it those tests skip).
import assert from "node:assert/strict";
import { test } from "node:test";
import { WebSocket } from "ws";
import { Connection, decodeFrames, encodeFrame, Kind } from "../ttyserve.js";

globalThis.WebSocket ??= WebSocket;
const server = process.env.TTYSERVE_TEST_SERVER;
const token = process.env.TTYSERVE_TEST_TOKEN;

test("a frame encodes and decodes whole, and a cut one is refused", () => {
  const payload = new TextEncoder().encode("hello");
  const frame = encodeFrame(Kind.CTRL_IN, 7, payload);
  assert.equal(frame.length, 9 + payload.length);
  const [decoded] = decodeFrames(frame);
  assert.deepEqual([decoded.kind, decoded.channel, [...decoded.payload]],
                   [Kind.CTRL_IN, 7, [...payload]]);
  assert.throws(() => decodeFrames(frame.subarray(0, frame.length - 1)), /inside a frame/);
});

test("a session's output and its exit, last", { skip: !server }, async () => {
  const connection = new Connection(server, { token, window: 65536 });
  const session = connection.open({ argv: ["sh", "-c", "echo from-node; exit 7"], pty: false });
  const events = [];
  const exit = await new Promise((resolve, reject) => {
    session.addEventListener("output", (e) => {
      events.push(new TextDecoder().decode(e.detail.data));
      session.consumed(e.detail.data.length);
    });
    session.addEventListener("exit", (e) => resolve(e.detail));
    session.addEventListener("refused", (e) => reject(new Error(e.detail.message)));
    session.addEventListener("lost", () => reject(new Error("lost")));
  });
  connection.close();
  assert.equal(events.join(""), "from-node\n");
  assert.equal(exit.code, 7);
});

test("modes come before any output and in their place between it", { skip: !server },
  async () => {
    const connection = new Connection(server, { token, window: 65536 });
    // Echo on, then off (a password prompt): the second `modes` comes before the "b" it covers.
    const session = connection.open({
      argv: ["sh", "-c", "printf a; read x; stty -echo; printf b; read y"], pty: true,
      modes: true });
    const events = [];
    let received = 0;
    const rtt = new Promise((resolve) => connection.addEventListener("pong",
      (e) => resolve(e.detail.ms), { once: true }));
    connection.ping();
    const exit = await new Promise((resolve, reject) => {
      session.addEventListener("modes", (e) => events.push({ ...e.detail, received }));
      session.addEventListener("output", (e) => {
        const text = new TextDecoder().decode(e.detail.data);
        events.push({ output: text });
        received += e.detail.data.length;
        session.consumed(e.detail.data.length);
        if (text.includes("a")) session.send(new TextEncoder().encode("go\r"));
        if (text.includes("b")) session.send(new TextEncoder().encode("\r"));
      });
      session.addEventListener("exit", (e) => resolve(e.detail));
      session.addEventListener("refused", (e) => reject(new Error(e.detail.message)));
      session.addEventListener("lost", () => reject(new Error("lost")));
    });
    connection.close();
    assert.equal(exit.code, 0);
    assert.equal(events[0].type, "modes");
    assert.deepEqual([events[0].input, events[0].offset], ["echoed", 0]);
    const hidden = events.findIndex((e) => e.input === "hidden");
    const b = events.findIndex((e) => e.output?.includes("b"));
    assert.ok(hidden > 0 && hidden < b, JSON.stringify(events));
    for (const e of events.filter((e) => e.type === "modes")) assert.equal(e.offset, e.received);
    assert.equal(session.modes.input, "hidden");
    assert.ok((await rtt) >= 0);
  });
