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
