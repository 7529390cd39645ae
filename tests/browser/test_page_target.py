"""The page on a door (protocol section 15): `#target=NAME` opens its session on that target
(whose far side's processes say which it is in $WHERE)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cdp import open_browser
from helpers import SH
from target_doors import door
from test_page import run_line, screen_has

from ttyserve.client import connect

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120), pytest.mark.usefixtures("workers")]


async def test_target_in_the_fragment_opens_the_session_there(short_dir: Path) -> None:
    with door(short_dir, {"web-1": {"persist": True}}, "--command", SH,
              listen=["ws:127.0.0.1:0"], expect_browse=1, env={"PS1": "$ "}) as server:
        async with open_browser() as browser:
            await browser.navigate(server.browse[0] + "&target=web-1")
            await browser.wait_for("document.body.dataset.session === 'running'")
            await run_line(browser, "echo where=$WHERE")
            await screen_has(browser, r"(?m)^(\$ )?where=web-1\s*$")  # (typed before the
            # shell's first prompt, the line comes after it)
            token = server.browse[0].split("#token=", 1)[1]
            async with connect(server.addresses[0], token=token, multiplex=True) as conn:
                (info,) = await conn.list_sessions()
            assert info.target == "web-1"
            assert browser.console_errors == []
