"""Section 11 in two real Chromium pages: a writer's page and an observer's, through the link
`ttyserve share` prints. Same screen cell for cell, the observer's keys reach nothing, and
`unshare` turns its page to revoked."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from cdp import Browser, open_browser
from helpers import ttyserve_command
from test_page import page, run_line, screen_has

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120), pytest.mark.usefixtures("workers")]

VIEWPORT = ("(() => { const b = window.term.buffer.active; const rows = [];"
            " for (let i = b.viewportY; i < b.viewportY + window.term.rows; i++)"
            " rows.push(b.getLine(i).translateToString(true)); return rows; })()")


async def viewport(browser: Browser) -> list[str]:
    rows: list[str] = await browser.evaluate(VIEWPORT)
    return rows


def ttyserve(*args: str, token: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(ttyserve_command(*args), capture_output=True, text=True, timeout=30,
                          env={**os.environ, "TTYSERVE_TOKEN": token})


async def test_a_writer_and_an_observer_through_a_grant_url(short_dir: Path) -> None:
    async with page(short_dir) as (writer, server):
        browse = server.browse[0]
        token = browse.split("#token=", 1)[1]
        address = "ws:" + browse.split("//", 1)[1].split("/", 1)[0]
        session_id = await writer.wait_for("window.ttyserve.session.id")
        shared = ttyserve("share", "--connect", address, session_id, token=token)
        assert shared.returncode == 0, shared.stderr
        grant, link = shared.stdout.splitlines()
        url = link.removeprefix("browse ")
        assert url.endswith(f"/#grant={grant}&session={session_id}")
        async with open_browser() as observer:
            await observer.navigate(url)
            await observer.wait_for("document.body.dataset.session === 'running'")
            assert "read-only" in await observer.evaluate("document.title")
            assert await observer.evaluate("document.body.dataset.role") == "observer"
            await writer.wait_for("document.body.dataset.observers === '1'")
            assert (await writer.evaluate("document.title")).endswith("1 watching")

            await run_line(writer, "echo shared-$((6*7))")
            await screen_has(observer, r"(?m)^shared-42$")
            await screen_has(writer, r"(?m)^shared-42$")
            assert await viewport(observer) == await viewport(writer)  # cell for cell

            await observer.evaluate(  # count what the page hands its session to send
                "(() => { const s = window.ttyserve.session; const send = s.send.bind(s);"
                " window.sent = 0; s.send = (b) => { window.sent += b.length; send(b); };"
                " return true; })()")
            await observer.type_text("echo typed-by-the-observer")  # reaches nothing
            await observer.press("Enter", "Enter", 13, text="\r")
            await run_line(writer, "echo after-$((6*7))")
            for browser in (writer, observer):
                text = await screen_has(browser, r"(?m)^after-42$")
                assert "typed-by-the-observer" not in text
            assert await viewport(observer) == await viewport(writer)
            assert await observer.evaluate("window.sent") == 0  # the page sent no key

            revoked = ttyserve("unshare", "--connect", address, grant, token=token)
            assert revoked.returncode == 0, revoked.stderr
            await observer.wait_for("document.body.dataset.session === 'revoked'")
            assert re.search(r"\[access revoked\]", await observer.screen_text())
            await writer.wait_for("document.body.dataset.observers === '0'")
            assert observer.console_errors == []
        await run_line(writer, "echo still-$((6*7))")  # the writer never noticed
        await screen_has(writer, r"(?m)^still-42$")
