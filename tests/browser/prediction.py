"""The page's prediction seen as the person sees it: the page behind a slow link (tests/delays.py)
and a probe in the page that records every state of the screen that was drawn.

What the person sees is the DOM xterm.js renders (the page loads no canvas or WebGL renderer:
the DOM renderer draws the rows as text) with the predictor's decorations on top of it (one
absolutely placed element per predicted cell, drawn by xterm.js's decoration renderer). The
probe composes the two: each row's text, with each decoration's character put in the cell its
box covers (from the boxes on screen, not from the predictor's own idea of where it is). It
samples at every change of that DOM (a MutationObserver: every state that existed, so one
drawn for a single frame is caught too) and at every animation frame, and keeps each distinct
state with its time and frame number. Keys are stamped as they reach the page (`term.onData`,
right after the page's own handler has predicted them)."""

from __future__ import annotations

import contextlib
import re
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from cdp import Browser, open_browser
from delays import DelayProxy, delay_proxy
from helpers import ServerProcess, kill_group, start_server

DELAY = 0.15  # s each way: a 300 ms round trip, a continent away
BASH = "bash --norc --noprofile -i"

PROBE = r"""
(() => {
  const term = window.term;
  const screen = document.querySelector(".xterm-screen");
  const rowsElement = document.querySelector(".xterm-rows");
  const probe = { log: [], keys: [], frame: 0, last: "" };
  probe.visible = () => {
    const rows = [...rowsElement.children].map((r) => r.textContent.replace(/\u00a0/g, " "));
    const box = screen.getBoundingClientRect();
    const height = box.height / term.rows, width = box.width / term.cols;
    const decorations = [];
    let over = 0; // decorations drawn over another character the server drew
    for (const d of screen.querySelectorAll(".xterm-decoration")) {
      if (!d.textContent || d.style.display === "none" || !d.isConnected) continue;
      const r = d.getBoundingClientRect();
      const row = Math.round((r.top - box.top) / height);
      const col = Math.round((r.left - box.left) / width);
      decorations.push({ row, col, char: d.textContent });
      if (row < 0 || row >= rows.length) continue;
      const text = rows[row].padEnd(col + 1);
      if (![" ", d.textContent].includes(text[col])) over++;
      rows[row] = text.slice(0, col) + d.textContent + text.slice(col + 1);
    }
    // What the predictor holds out to be drawn (to any `draw`; xterm.js's own decorations
    // are hidden on the alternate screen, so there the DOM alone would not tell).
    const cells = window.ttyserve.predictor.cells().map((c) => c.char).join("");
    return { rows: rows.map((r) => r.trimEnd()), decorations, over, cells };
  };
  probe.sample = () => {
    const seen = probe.visible();
    const key = JSON.stringify(seen);
    if (key === probe.last) return;
    probe.last = key;
    probe.log.push({ t: performance.now(), frame: probe.frame, ...seen });
  };
  probe.reset = () => { probe.log = []; probe.keys = []; probe.last = ""; probe.sample(); };
  new MutationObserver(() => probe.sample()).observe(screen,
    { subtree: true, childList: true, characterData: true, attributes: true });
  const tick = () => { probe.frame++; probe.sample(); requestAnimationFrame(tick); };
  requestAnimationFrame(tick);
  term.onData((data) => probe.keys.push({ t: performance.now(), frame: probe.frame, data }));
  window.probe = probe;
  return true;
})()
"""


@dataclass
class SlowPage:
    """A browser on the page of a server behind a DelayProxy."""

    browser: Browser
    server: ServerProcess
    proxy: DelayProxy
    url: str  # the page's URL through the proxy, token in its fragment
    screens: dict[str, list[str]] = field(default_factory=dict)

    async def open(self, predict: str) -> None:
        """A fresh page (and session) with ``#predict=``, the probe in it, at the prompt."""
        if await self.browser.evaluate("location.href") != "about:blank":
            await self.browser.evaluate("sessionStorage.clear(), true")  # a new session
            await self.browser.navigate("about:blank")
        await self.browser.navigate(f"{self.url}&predict={predict}")
        await self.browser.wait_for("document.body.dataset.session === 'running'", timeout=30)
        await self.browser.evaluate(PROBE)
        await self.shows(r"(?m)^\$$")

    async def visible(self) -> dict[str, Any]:
        """The screen as drawn now: {rows, decorations, over: how many decorations cover
        another character the server's output drew there, cells: the characters of the
        predictor's `cells()`}."""
        seen: dict[str, Any] = await self.browser.evaluate("probe.visible()")
        return seen

    async def shows(self, pattern: str, timeout: float = 20) -> list[str]:
        """Until the drawn screen matches ``pattern``, checked at every frame."""
        rows: list[str] = []
        with anyio.move_on_after(timeout):
            while not re.search(pattern, "\n".join(rows := (await self.visible())["rows"])):
                await self.frames(1)
            return rows
        raise AssertionError(f"{pattern!r} not drawn within {timeout} s:\n" + "\n".join(rows))

    async def echoed(self, pattern: str, timeout: float = 20) -> None:
        """Until the server's output (the terminal's buffer, predictions aside) matches
        ``pattern``, and the frames after it were drawn."""
        text = ""
        with anyio.move_on_after(timeout):
            while not re.search(pattern, text := await self.browser.screen_text()):
                await self.frames(1)
            await self.frames(3)
            return
        raise AssertionError(f"{pattern!r} not in the output within {timeout} s:\n{text}")

    async def frames(self, count: int) -> None:
        await self.browser.evaluate(
            f"new Promise((resolve) => {{ const end = probe.frame + {count};"
            " const wait = () => probe.frame >= end ? resolve(true)"
            " : requestAnimationFrame(wait); wait(); })")

    async def settled(self) -> list[str]:
        """The drawn screen once the frames after the last output were drawn (a decoration's
        removal is drawn at the next frame)."""
        await self.frames(3)
        rows: list[str] = (await self.visible())["rows"]
        return rows

    async def log(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Every distinct drawn state since `probe.reset()`, and the keys typed since."""
        log, keys = await self.browser.evaluate("[probe.log, probe.keys]")
        return log, keys

    async def type_keys(self, text: str) -> None:
        for char in text:
            await self.browser.type_text(char)

    async def enter(self) -> None:
        await self.browser.press("Enter", "Enter", 13, text="\r")

    async def run_line(self, line: str) -> None:
        await self.browser.type_text(line)
        await self.enter()


@contextlib.asynccontextmanager
async def slow_page(short_dir: Path, delay: float = DELAY, command: str = BASH,
                    ) -> AsyncIterator[SlowPage]:
    """A server running ``command`` with a plain prompt, a DelayProxy in front of its `ws:`
    listener and a headless Chromium that reaches the page through it; at the end no console
    error, and the server and its sessions killed."""
    async with delay_proxy(delay) as proxy:
        origin = f"http://127.0.0.1:{proxy.port}"
        server = start_server(short_dir, "--command", command, "--allow-origin", origin,
                              listen=["ws:127.0.0.1:0"], expect_browse=1,
                              env={"PS1": "$ ", "TERM": "xterm-256color", "HISTFILE": "",
                                   "INPUTRC": "/dev/null"})
        try:
            proxy.target = ("127.0.0.1", int(server.addresses[0].rsplit(":", 1)[1]))
            url = re.sub(r"//[^/]+/", f"//127.0.0.1:{proxy.port}/", server.browse[0])
            async with open_browser(900, 600) as browser:
                yield SlowPage(browser, server, proxy, url)
                assert browser.console_errors == [], browser.console_errors
        finally:
            groups = server.session_children()
            server.stop(signal.SIGKILL) if server.proc.poll() is None else None
            for group in groups:
                kill_group(group)


def key_latencies(log: list[dict[str, Any]], keys: list[dict[str, Any]],
                  cells: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """For each key (in order) and the cell (row, col) it should draw its character in: when
    it was first drawn there, after how many ms and frames, and whether as a prediction (a
    decoration) or by the server's output. A space is left out: it draws nothing to see."""
    found = []
    for key, (row, col) in zip(keys, cells, strict=True):
        char = key["data"]
        if char == " ":
            continue
        for state in log:
            if state["t"] < key["t"]:
                continue
            line = state["rows"][row] if row < len(state["rows"]) else ""
            if line[col:col + 1] == char:
                predicted = any(d["row"] == row and d["col"] == col for d in state["decorations"])
                found.append({"char": char, "ms": state["t"] - key["t"],
                              "frames": state["frame"] - key["frame"], "predicted": predicted})
                break
        else:
            raise AssertionError(f"{char!r} never drawn at {(row, col)}")
    return found


def frames_contradicted(log: list[dict[str, Any]]) -> int:
    """The most frames in a row that showed a prediction over another character the server
    had drawn (a contradicted prediction not yet taken back)."""
    longest, since = 0, None
    for state in log:
        if state["over"] and since is None:
            since = state["frame"]
        elif not state["over"] and since is not None:
            longest, since = max(longest, state["frame"] - since), None
    if since is not None:
        longest = max(longest, log[-1]["frame"] - since + 1)
    return longest
