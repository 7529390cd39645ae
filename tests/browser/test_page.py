"""The built-in terminal page in real headless Chromium (Debian's), against a real server.

Keys are typed at the keyboard (DevTools Input), the screen is read back through
`window.term`, and every test ends with no console error and nothing loaded from
another origin.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from cdp import Browser, open_browser
from faults import FaultProxy, fault_proxy
from helpers import (
    SH,
    ServerProcess,
    children_of,
    kill_group,
    start_server,
    wait_until,
)

from ttyserve.client import connect

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120), pytest.mark.usefixtures("workers")]
CTRL = 2  # the DevTools modifier bit


@contextlib.asynccontextmanager
async def page(short_dir: Path, *args: str, width: int = 900, height: int = 600,
               expected_errors: str | None = None, fragment: str = "",
               ) -> AsyncIterator[tuple[Browser, ServerProcess]]:
    """A server with a `ws:` listener, and a browser on its page (the printed URL, with
    ``fragment`` after it)."""
    server = start_server(short_dir, "--command", SH, *args, listen=["ws:127.0.0.1:0"],
                          expect_browse=1, env={"PS1": "$ "})
    try:
        async with open_browser(width, height) as browser:
            await browser.navigate(server.browse[0] + fragment)
            await browser.wait_for("document.body.dataset.session === 'running'")
            # Keys typed before the shell's first prompt are echoed by the terminal before it,
            # and the command's output then follows the prompt on its line.
            await screen_has(browser, r"(?m)^\$\s*$")
            yield browser, server
            origin = server.browse[0].split("/#", 1)[0]
            loaded = await browser.resources()
            assert any(url.endswith("/static/vendor/xterm.mjs") for url in loaded), loaded
            assert [url for url in loaded if not url.startswith(origin + "/")] == []
            errors = [e for e in browser.console_errors
                      if expected_errors is None or not re.search(expected_errors, e)]
            assert errors == [], browser.console_errors
    finally:
        end_server(server)


def end_server(server: ServerProcess) -> None:
    """The server and every session it started, killed (a page test may leave a shell)."""
    groups = server.session_children()
    server.stop(signal.SIGKILL) if server.proc.poll() is None else None
    for group in groups:
        kill_group(group)


async def run_line(browser: Browser, line: str) -> None:
    await browser.type_text(line)
    await browser.press("Enter", "Enter", 13, text="\r")


async def screen_has(browser: Browser, pattern: str, timeout: float = 20) -> str:
    text = ""
    with anyio.move_on_after(timeout):
        while not re.search(pattern, text := await browser.screen_text()):
            await browser.evaluate("new Promise((resolve) => setTimeout(resolve, 50))")
        return text
    raise AssertionError(f"{pattern!r} not on the screen within {timeout} s:\n{text}")


async def test_keys_reach_the_shell_and_its_output_the_screen(short_dir: Path) -> None:
    async with page(short_dir) as (browser, _):
        await run_line(browser, "echo hello-$((6*7))")
        await screen_has(browser, r"(?m)^hello-42$")
        assert await browser.evaluate("document.title") == f"{SH} — running"
        shot = os.environ.get("TTYSERVE_SCREENSHOT")
        if shot:  # `make screenshot`: the picture in the README
            await run_line(browser, "printf '\\033[1;32mttyserve\\033[0m in a browser: '; "
                                    "uname -sm; seq -s ' ' 1 12")
            await screen_has(browser, r"(?m)^1 2 3 4 5 6 7 8 9 10 11 12$")
            await browser.screenshot(Path(shot))


async def test_resizing_the_page_resizes_the_terminal(short_dir: Path) -> None:
    async with page(short_dir) as (browser, _):
        before = await browser.evaluate("[term.rows, term.cols]")
        await browser.set_viewport(1300, 760)
        after = await browser.wait_for(
            f"(term.rows !== {before[0]} || term.cols !== {before[1]}) && [term.rows, term.cols]")
        await run_line(browser, "stty size")
        await screen_has(browser, rf"(?m)^{after[0]} {after[1]}$")


def sleeping(server: ServerProcess) -> bool:
    """Whether the session's shell runs a `sleep` (in a job of its own, under job control)."""
    for shell in server.session_children():
        for pid in children_of(shell):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":
                    return True
    return False


async def test_ctrl_c_interrupts_a_sleep(short_dir: Path) -> None:
    async with page(short_dir) as (browser, server):
        await run_line(browser, "sleep 30")
        assert await wait_until(lambda: sleeping(server), timeout=10)
        await browser.press("c", "KeyC", 67, modifiers=CTRL)
        assert await wait_until(lambda: not sleeping(server), timeout=5)
        await run_line(browser, "echo status-$?")
        await screen_has(browser, r"(?m)^status-130$", timeout=10)


async def test_a_flood_finishes_and_the_page_stays_responsive(short_dir: Path) -> None:
    async with page(short_dir) as (browser, _):
        await run_line(browser, "seq 1 300000; echo flood-done")
        await screen_has(browser, r"(?m)^flood-done$", timeout=90)
        await run_line(browser, "echo still-here")
        await screen_has(browser, r"(?m)^still-here$", timeout=5)


async def test_50_mb_to_the_page_with_bounded_server_memory(short_dir: Path) -> None:
    async with page(short_dir) as (browser, server):
        baseline = server.rss_kib()
        await run_line(browser, "head -c 50000000 /dev/zero | tr '\\0' 'y' | fold -w 199; "
                                "echo; echo fifty-done")
        peak, in_flight, window = baseline, 0, await browser.evaluate(
            "ttyserve.connection.window")
        with anyio.fail_after(100):
            while not re.search(r"(?m)^fifty-done$", await browser.screen_text()):
                peak = max(peak, server.rss_kib())
                in_flight = max(in_flight, await browser.evaluate(
                    "ttyserve.session.bytesReceived - ttyserve.session.bytesConsumed"))
                await anyio.sleep(0.05)  # sampling while the page renders
        received = await browser.evaluate("ttyserve.session.bytesReceived")
        print(f"{received} bytes rendered; server RSS {baseline} KiB before, {peak} KiB at "
              f"most; at most {in_flight} bytes received and not yet rendered")
    assert received > 50_000_000
    assert 0 < in_flight <= window  # credit goes back from the render callback only
    assert peak - baseline < 32 * 1024, (baseline, peak)


async def test_exit_shows_the_line_and_the_data_attributes(short_dir: Path) -> None:
    async with page(short_dir) as (browser, _):
        await run_line(browser, "exit 3")
        await browser.wait_for("document.body.dataset.session === 'ended'")
        assert await browser.evaluate("document.body.dataset.exitCode") == "3"
        assert await browser.evaluate("document.body.dataset.signal") is None
        await screen_has(browser, r"\[exited: code 3\]")
        assert (await browser.evaluate("document.title")).endswith("exited 3")


async def test_a_signal_death_names_the_signal(short_dir: Path) -> None:
    async with page(short_dir) as (browser, _):
        await run_line(browser, "kill -9 $$")
        await browser.wait_for("document.body.dataset.session === 'ended'")
        assert await browser.evaluate("[document.body.dataset.exitCode, "
                                      "document.body.dataset.signal]") == ["-9", "KILL"]
        await screen_has(browser, r"\[killed by signal KILL\]")


async def test_a_killed_server_shows_connection_lost_once_reattaching_fails(
        short_dir: Path) -> None:
    # The page's tries to reach the dead server are the browser's own console errors.
    async with page(short_dir, expected_errors=r"WebSocket connection to .* failed") as (
            browser, server):
        await run_line(browser, "echo alive")
        await screen_has(browser, r"(?m)^alive$")
        groups = server.session_children()
        server.stop(signal.SIGKILL)
        for group in groups:
            kill_group(group)
        await browser.wait_for("document.title.endsWith('reconnecting')", timeout=5)
        await browser.wait_for("document.body.dataset.session === 'lost'", timeout=20)
        await screen_has(browser, r"\[connection lost\]")


@pytest.mark.parametrize("keep", ["", "&keep=1"], ids=["default", "keep=1"])
async def test_a_closed_tab_keeps_its_shell_15_minutes_or_as_keep_says(
        short_dir: Path, keep: str) -> None:
    """Section 8: the page's session is kept 900 s without its tab, or #keep=SECONDS (up to
    the server's limit: this one's is 600, under the page's 900, which it then asks for)."""
    async with page(short_dir, "--detached-timeout", "600", fragment=keep) as (
            browser, server):
        await run_line(browser, "echo pid=$$")
        text = await screen_has(browser, r"(?m)^pid=(\d+)$")
        shell = int(re.search(r"(?m)^pid=(\d+)$", text).group(1))  # type: ignore[union-attr]
        await browser.navigate("about:blank")  # the tab closes its session's connection
        token = server.browse[0].split("#token=", 1)[1]
        async with connect(server.addresses[0], token=token, multiplex=True) as conn:
            while any(s.attached for s in await conn.list_sessions()):
                await anyio.sleep(0.05)  # (no event tells another client of a detach)
        if keep:  # hung up a second after it was left
            assert await wait_until(lambda: not os.path.exists(f"/proc/{shell}"), 10)
        else:  # (600 s to go: still there once a keep of 1 s would have ended it)
            await anyio.sleep(3)
            assert os.path.exists(f"/proc/{shell}")
        await browser.navigate(server.browse[0])  # (page()'s checks read its resources)
        await browser.wait_for("document.body.dataset.session === 'running'")


async def test_a_reload_keeps_the_same_shell_and_shows_its_scrollback(short_dir: Path) -> None:
    async with page(short_dir) as (browser, _):
        await run_line(browser, "echo marker; echo pid=$$")
        before = (await screen_has(browser, r"(?m)^pid=(\d+)$"))
        pid = re.search(r"(?m)^pid=(\d+)$", before).group(1)  # type: ignore[union-attr]
        await browser.send("Page.reload")
        await browser.wait_for("document.readyState === 'complete'")
        await browser.wait_for("document.body.dataset.session === 'running'")
        await screen_has(browser, r"(?m)^marker$")  # the scrollback, replayed
        await run_line(browser, "echo again-pid=$$")
        after = await screen_has(browser, r"(?m)^again-pid=(\d+)$")
        assert f"again-pid={pid}" in after, after  # the same shell: the same $$


async def test_a_dropped_connection_reattaches_with_no_reload(short_dir: Path) -> None:
    async with page(short_dir) as (browser, _):
        await run_line(browser, "echo before-drop")
        await screen_has(browser, r"(?m)^before-drop$")
        session = await browser.evaluate("ttyserve.session.id")
        await browser.evaluate("window.dropped = ttyserve.connection;"
                               " dropped.socket.close(); true")  # as when the network drops
        await browser.wait_for(f"ttyserve.connection !== window.dropped && "
                               f"ttyserve.session.id === {session!r} && "
                               "ttyserve.session.pid !== null && "
                               "document.title.endsWith('running')", timeout=15)
        await run_line(browser, "echo after-drop")
        text = await screen_has(browser, r"(?m)^after-drop$")
        assert "before-drop" in text  # the scrollback came back with it


# --- section 10: the page resumes, and never drops a key ------------------------------


@contextlib.asynccontextmanager
async def page_through_proxy(short_dir: Path,
                             ) -> AsyncIterator[tuple[Browser, FaultProxy, str]]:
    """The page's URL through a real fault injector (a TCP proxy), and a browser."""
    async with fault_proxy("tcp:127.0.0.1:1") as proxy:
        origin = f"http://127.0.0.1:{proxy.port}"
        server = start_server(short_dir, "--command", SH, "--allow-origin", origin,
                              listen=["ws:127.0.0.1:0"], expect_browse=1, env={"PS1": "$ "})
        try:
            proxy.target = ("127.0.0.1", int(server.addresses[0].rsplit(":", 1)[1]))
            url = re.sub(r"//[^/]+/", f"//127.0.0.1:{proxy.port}/", server.browse[0])
            async with open_browser(900, 600) as browser:
                yield browser, proxy, url
                errors = [e for e in browser.console_errors
                          if not re.search(r"WebSocket connection to .* failed", e)]
                assert errors == [], browser.console_errors
        finally:
            end_server(server)


async def test_a_cut_websocket_resumes_with_every_number_on_screen_once(
        short_dir: Path) -> None:
    async with page_through_proxy(short_dir) as (browser, proxy, url):
        await browser.navigate(url)
        await browser.wait_for("document.body.dataset.session === 'running'")
        await run_line(browser, "i=0; while [ $i -lt 300 ]; do i=$((i+1)); echo n$i; "
                                "sleep 0.01; done; echo count-done")
        await screen_has(browser, r"(?m)^n40$")
        proxy.cut()  # both ways, while the counter prints
        await browser.wait_for("document.title.endsWith('reconnecting')", timeout=5)
        await browser.wait_for("document.title.endsWith('running')", timeout=15)
        await screen_has(browser, r"(?m)^count-done$", timeout=30)
        text = await browser.screen_text(last=1000)  # the whole scrollback
        numbers = [int(n) for n in re.findall(r"(?m)^n(\d+)$", text)]
        assert numbers == list(range(1, 301)), numbers
        assert proxy.faults == ["cut"]


async def test_an_upgrade_in_place_is_a_short_reconnect_and_nothing_on_screen(
        short_dir: Path) -> None:
    """SIGUSR2 (section 12): the page's connection gets `server_restarting` and is closed; it
    reattaches to the same shell at its offsets, every number once, and the screen shows
    nothing of the restart (a full-screen program's would be spoilt)."""
    async with page(short_dir) as (browser, server):
        await run_line(browser, "i=0; while [ $i -lt 300 ]; do i=$((i+1)); echo n$i; "
                                "sleep 0.01; done; echo count-done")
        await screen_has(browser, r"(?m)^n40$")
        session = await browser.evaluate("ttyserve.session.id")
        os.kill(server.pid, signal.SIGUSR2)
        await browser.wait_for("document.title.endsWith('reconnecting')", timeout=15)
        await browser.wait_for(f"document.title.endsWith('running') && "
                               f"ttyserve.session.id === {session!r}", timeout=30)
        await screen_has(browser, r"(?m)^count-done$", timeout=30)
        text = await browser.screen_text(last=1000)
        numbers = [int(n) for n in re.findall(r"(?m)^n(\d+)$", text)]
        assert numbers == list(range(1, 301)), numbers
        assert "server_restarting" not in text
        assert server.proc.poll() is None  # the same server process


async def test_keys_typed_before_the_session_and_while_it_reconnects_arrive_whole(
        short_dir: Path) -> None:
    async with page_through_proxy(short_dir) as (browser, proxy, url):
        proxy.hold_upgrades = anyio.Event()  # the page appears; its WebSocket waits
        await browser.navigate(url)
        await browser.wait_for("window.term !== undefined && window.ttyserve !== undefined")
        await run_line(browser, "echo first-$((2+3))")  # the instant the terminal appears
        assert await browser.evaluate("ttyserve.queued.length") > 0  # no session yet: queued
        proxy.hold_upgrades.set()
        # (typed before the shell prompted: its output may follow the prompt on its line)
        await screen_has(browser, r"(?m)^(\$ )?first-5$")
        proxy.hold_upgrades = anyio.Event()
        proxy.cut()
        await browser.wait_for("document.title.endsWith('reconnecting')", timeout=5)
        await run_line(browser, "echo away-$((3+4))")  # typed while it reconnects
        assert await browser.evaluate("ttyserve.queued.length") > 0
        proxy.hold_upgrades.set()
        text = await screen_has(browser, r"(?m)^away-7$")
        assert len(re.findall(r"(?m)^(?:\$ )?first-5$", text)) == 1  # nothing shown twice


async def test_a_reload_restores_the_alternate_screen_the_ring_lost(short_dir: Path) -> None:
    """After a reload the page starts from a reset terminal and the session's prologue: the
    alternate screen comes back though the ring (4 KiB here) long lost its switch."""
    async with page(short_dir, "--scrollback", "4096") as (browser, _):
        await run_line(browser, "printf '\\033[?1049h'; seq 1 5000; echo switched-away")
        await screen_has(browser, r"(?m)^switched-away$")
        assert await browser.evaluate("term.buffer.active.type") == "alternate"
        await browser.send("Page.reload")
        await browser.wait_for("document.readyState === 'complete'")
        await browser.wait_for("document.body.dataset.session === 'running'")
        await screen_has(browser, r"(?m)^switched-away$")  # the ring's tail, replayed
        assert await browser.evaluate("term.buffer.active.type") == "alternate"
