"""Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe).

No WebDriver, no browser download: Debian's `chromium`, started with its
DevTools endpoint on file descriptors 3 (commands in) and 4 (answers and events
out), NUL-separated JSON. Enough of CDP for the page tests: navigate, evaluate,
type keys, resize the viewport, take a screenshot, and collect console errors.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
INSTALL_HINT = "apt-get install chromium (Debian) to run the browser tests"


def find_chromium() -> str | None:
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path is not None:
            return path
    return None


class BrowserError(Exception):
    """A DevTools command failed, or the page threw."""


@dataclass
class Browser:
    """One Chromium process and one page (tab) in it."""

    process: subprocess.Popen[bytes]
    to_browser: int
    from_browser: int
    session: str = ""
    console_errors: list[str] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _pending: dict[int, Any] = field(default_factory=dict)
    _buffer: bytes = b""

    async def _read_message(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            await anyio.wait_readable(self.from_browser)
            chunk = os.read(self.from_browser, 1 << 20)
            if not chunk:
                raise BrowserError("chromium closed its DevTools pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(raw)
        return message

    def _event(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        params = message.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            texts = [str(arg.get("value", arg.get("description", ""))) for arg in params["args"]]
            self.console_errors.append(" ".join(texts))
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.console_errors.append(details.get("exception", {}).get("description")
                                       or details.get("text", "exception"))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.console_errors.append(params["entry"]["text"])


    async def send(self, method: str, params: dict[str, Any] | None = None,
                   session: bool = True) -> dict[str, Any]:
        """Run one DevTools command and return its result (raises BrowserError on error)."""
        ident = next(self._ids)
        command: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session and self.session:
            command["sessionId"] = self.session
        data = json.dumps(command).encode() + b"\0"
        while data:
            await anyio.wait_writable(self.to_browser)
            data = data[os.write(self.to_browser, data):]
        while True:
            message = await self._read_message()
            if message.get("id") == ident:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            self._event(message)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises are awaited)."""
        result = await self.send("Runtime.evaluate", {
            "expression": expression, "awaitPromise": True, "returnByValue": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 15) -> Any:
        """Until ``expression`` is truthy in the page, checked as its events are processed."""
        with anyio.fail_after(timeout):
            while not (value := await self.evaluate(expression)):
                await self.evaluate("new Promise((resolve) => requestAnimationFrame(resolve))")
            return value

    async def navigate(self, url: str) -> None:
        await self.send("Page.navigate", {"url": url})
        await self.wait_for("document.readyState === 'complete'")

    async def type_text(self, text: str) -> None:
        """Text typed at the keyboard, into whatever has the focus."""
        await self.send("Input.insertText", {"text": text})

    async def press(self, key: str, code: str, key_code: int, modifiers: int = 0,
                    text: str = "") -> None:
        """One key press (2 in ``modifiers`` is Ctrl), as the keyboard sends it."""
        event = {"key": key, "code": code, "windowsVirtualKeyCode": key_code,
                 "modifiers": modifiers}
        await self.send("Input.dispatchKeyEvent", {"type": "keyDown", **event,
                                                   **({"text": text} if text else {})})
        await self.send("Input.dispatchKeyEvent", {"type": "keyUp", **event})

    async def set_viewport(self, width: int, height: int) -> None:
        await self.send("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    async def screenshot(self, path: Path) -> None:
        result = await self.send("Page.captureScreenshot", {"format": "png"})
        path.write_bytes(base64.b64decode(result["data"]))

    async def resources(self) -> list[str]:
        """Every URL the page loaded a resource from (scripts, styles, images, fetches)."""
        urls: list[str] = await self.evaluate(
            "[location.href, ...performance.getEntriesByType('resource').map((e) => e.name)]")
        return urls

    async def screen_text(self, last: int = 100) -> str:
        """The last lines of the terminal's active buffer, read through `window.term`
        (a few: reading all of a long scrollback would slow the page it measures)."""
        text: str = await self.evaluate(
            "(() => { const b = window.term.buffer.active; const lines = [];"
            f" for (let i = Math.max(0, b.length - {last}); i < b.length; i++)"
            " lines.push(b.getLine(i).translateToString(true));"
            " return lines.join('\\n'); })()")
        return text


@contextlib.asynccontextmanager
async def open_browser(width: int = 900, height: int = 600) -> AsyncIterator[Browser]:
    """A headless Chromium with one page, closed and reaped at the end."""
    chromium = find_chromium()
    assert chromium is not None, INSTALL_HINT
    profile = tempfile.mkdtemp(prefix="tts-chromium-")
    commands_read, commands_write = os.pipe()
    answers_read, answers_write = os.pipe()
    argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-extensions", "--mute-audio",
            # A page left is closed, its WebSocket with it, as a closed tab's: never kept
            # alive, silent, in the back/forward cache.
            "--disable-features=BackForwardCache",
            f"--user-data-dir={profile}", "--remote-debugging-pipe",
            f"--window-size={width},{height}", "about:blank"]

    def wire_pipes() -> None:  # in the child: its DevTools pipe is fds 3 and 4
        commands, answers = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
                             for fd in (commands_read, answers_write))
        os.dup2(commands, 3)
        os.dup2(answers, 4)

    # TMPDIR: its singleton socket directory goes in the profile, which we remove (killed,
    # it never removes that directory itself).
    process = subprocess.Popen(argv, pass_fds=(3, 4), preexec_fn=wire_pipes,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True,
                               env={**os.environ, "TMPDIR": profile})
    os.close(commands_read)
    os.close(answers_write)
    os.set_blocking(commands_write, False)
    os.set_blocking(answers_read, False)
    browser = Browser(process, commands_write, answers_read)
    try:
        with anyio.fail_after(30):
            targets = await browser.send("Target.getTargets", session=False)
            page = next(t for t in targets["targetInfos"] if t["type"] == "page")
            attached = await browser.send("Target.attachToTarget",
                                          {"targetId": page["targetId"], "flatten": True},
                                          session=False)
            browser.session = attached["sessionId"]
            for domain in ("Page", "Runtime", "Log"):  # not Network: every WebSocket frame
                await browser.send(f"{domain}.enable")
            await browser.set_viewport(width, height)
        yield browser
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        for fd in (commands_write, answers_read):
            os.close(fd)
        shutil.rmtree(profile, ignore_errors=True)
