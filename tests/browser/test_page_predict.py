"""The page predicts (protocol section 14, "The page"): through a proxy that delays each
direction 150 ms, keys show within a frame once the server's echo has confirmed the run, a
secret is never drawn, not even for a frame, a program that draws something else than the key
ends with exactly what it drew, and full-screen programs get no prediction. Every test plays
its keys twice, with `#predict=never` and with prediction, and the two screens must be equal.

What is checked is what the person sees: the screen as drawn (the DOM renderer's rows with the
predictor's decorations over them), sampled at every change and every frame by the probe of
tests/browser/prediction.py."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
from prediction import SlowPage, frames_contradicted, key_latencies, slow_page

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(240), pytest.mark.usefixtures("workers")]
SECRET = "QJXZK"  # no command line of these tests holds a capital letter (nor a temp path)

# A program that reads keys raw (the verdict: `application`) and draws each itself, as it is
# or upper-cased; Enter turns the terminal to a password prompt (ECHO off, ICANON on: `hidden`)
# at once, so keys typed right after Enter are never echoed by the line discipline either.
KEYS = """\
import os, sys, termios, tty
upper = sys.argv[1:] == ["upper"]
saved = termios.tcgetattr(0)
tty.setraw(0)
os.write(1, b"name> ")
while (key := os.read(0, 1)) != b"\\r":
    os.write(1, key.upper() if upper else key)
hidden = termios.tcgetattr(0)
hidden[0] |= termios.ICRNL
hidden[3] = (saved[3] | termios.ICANON) & ~termios.ECHO
termios.tcsetattr(0, termios.TCSANOW, hidden)
os.write(1, b"\\r\\nsecret: ")
line = sys.stdin.buffer.readline()
termios.tcsetattr(0, termios.TCSANOW, saved)
os.write(1, b"\\r\\ngot=%d\\r\\n" % len(line.strip()))
"""


def keys_program(short_dir: Path) -> str:
    path = short_dir / "keys.py"
    path.write_text(KEYS)
    return f"{sys.executable} {path}"


async def cursor(slow: SlowPage) -> tuple[int, int]:
    """The cursor's cell in the viewport (row, col), as the server's output left it."""
    row, col = await slow.browser.evaluate(
        "[term.buffer.active.cursorY, term.buffer.active.cursorX]")
    return row, col


def never_drawn(log: list[dict[str, Any]], secret: str) -> None:
    """No state drawn held a decoration (nor had the predictor one to draw), or any character
    of ``secret``."""
    assert log, "the probe drew nothing"
    for state in log:
        assert state["decorations"] == [] and state["cells"] == "", state
        for row in state["rows"]:
            assert not set(secret) & set(row), state


async def test_typed_text_is_drawn_within_a_frame_once_the_echo_confirmed_the_run(
        short_dir: Path) -> None:
    """At bash's prompt (readline: `application`), `#predict=auto` over a 300 ms round trip:
    the first key waits for its echo; every key after it is drawn, as a decoration, within a
    frame or two of reaching the page, long before its echo."""
    async with slow_page(short_dir) as slow:
        figures = {}
        for predict in ("never", "auto"):
            await slow.open(predict)
            if predict == "auto":  # the ping's round trip (~300 ms) is over 30 ms
                await slow.browser.wait_for("document.body.dataset.predict === 'on'")
            assert await slow.browser.evaluate("document.body.dataset.input") == "application"
            row, col = await cursor(slow)
            await slow.browser.evaluate("probe.reset(), true")
            typed = "echo hello-world"
            for at, char in enumerate(typed):
                await slow.type_keys(char)
                if char != " ":  # (a space draws nothing to wait for)
                    await slow.shows(rf"(?m)^\$ {re.escape(typed[:at + 1])}$")
            await slow.enter()
            await slow.shows(r"(?m)^hello-world\n\$$")
            slow.screens[predict] = await slow.settled()
            log, keys = await slow.log()
            found = key_latencies(log, keys[:len(typed)],
                                  [(row, col + at) for at in range(len(typed))])
            figures[predict] = found
            print(predict, [(f["char"], round(f["ms"]), f["frames"], f["predicted"])
                            for f in found])
            if predict == "never":
                assert all(not state["decorations"] for state in log)
            else:
                assert not found[0]["predicted"]  # the run starts tentative: its echo first
                for f in found[1:]:
                    assert f["predicted"], found  # drawn before the server's echo came
                    assert f["frames"] <= 2, found  # at the next frame (or the one after)
        assert slow.screens["auto"] == slow.screens["never"]


async def test_a_read_s_prompt_never_draws_a_typed_character(short_dir: Path) -> None:
    """bash's `read -s`: the `hidden` verdict comes before the prompt, the page says the input
    is hidden, and from the first key until the answer no frame holds one of its characters
    or any prediction."""
    async with slow_page(short_dir) as slow:
        for predict in ("never", "always"):
            await slow.open(predict)
            await slow.run_line("read -s -p 'secret: ' s; echo; echo \"got=${#s}\"")
            await slow.shows(r"(?m)^secret:$")
            # (the `modes` that covers the prompt came before it: no waiting for it)
            assert await slow.browser.evaluate(
                "[document.body.dataset.input, document.body.dataset.predict,"
                " document.getElementById('status').textContent,"
                " getComputedStyle(document.getElementById('status')).display]",
            ) == ["hidden", "off", "input hidden", "block"]
            await slow.browser.evaluate("probe.reset(), true")
            for char in SECRET:
                await slow.type_keys(char)
                await slow.frames(2)  # each key given the frames to be drawn in
            await slow.enter()
            await slow.shows(rf"(?m)^got={len(SECRET)}\n\$$")
            slow.screens[predict] = await slow.settled()
            log, _ = await slow.log()
            never_drawn(log, SECRET)
            assert await slow.browser.evaluate(
                "[document.body.dataset.input, document.getElementById('status').textContent]",
            ) == ["application", ""]
        assert slow.screens["always"] == slow.screens["never"]


async def test_keys_typed_ahead_into_a_password_prompt_are_never_drawn(short_dir: Path) -> None:
    """A program whose own echo confirmed the run, Enter, and the secret typed at once, before
    the password prompt (and its `hidden`) can have come back: those keys belong to a new
    run, tentative, and no echo ever confirms it, so not one frame shows them."""
    program = keys_program(short_dir)
    async with slow_page(short_dir) as slow:
        for predict in ("never", "always"):
            await slow.open(predict)
            await slow.run_line(program)
            await slow.shows(r"(?m)^name>$")
            assert await slow.browser.evaluate("document.body.dataset.input") == "application"
            row, col = await cursor(slow)
            await slow.browser.evaluate("probe.reset(), true")
            for at, char in enumerate("abc"):
                await slow.type_keys(char)
                await slow.shows(rf"(?m)^name> {'abc'[:at + 1]}$")
            log, keys = await slow.log()
            drawn = key_latencies(log, keys, [(row, col + at) for at in range(3)])
            # The run is confirmed and shown: what follows Enter is kept back by its epoch.
            assert [f["predicted"] for f in drawn] == [False, *[predict == "always"] * 2]
            await slow.echoed(r"(?m)^name> abc$")
            await slow.browser.evaluate("probe.reset(), true")
            await slow.enter()
            await slow.type_keys(SECRET)  # typed ahead: the prompt is 300 ms away
            await slow.shows(r"(?m)^secret:$")
            await slow.enter()
            await slow.shows(rf"(?m)^got={len(SECRET)}\n\$$")
            slow.screens[predict] = await slow.settled()
            log, _ = await slow.log()
            never_drawn(log, SECRET)
        assert slow.screens["always"] == slow.screens["never"]


async def test_a_program_that_draws_other_characters_ends_with_what_it_drew(
        short_dir: Path) -> None:
    """The program echoes letters upper-cased: the predicted lower-case letters are drawn (the
    run was confirmed by a digit's echo) and taken back at the server's first contradicting
    cell, and the screen is then exactly the screen without prediction."""
    program = keys_program(short_dir) + " upper"
    async with slow_page(short_dir) as slow:
        middle = {}
        for predict in ("never", "always"):
            await slow.open(predict)
            await slow.run_line(program)
            await slow.shows(r"(?m)^name>$")
            for at, char in enumerate("12"):  # echoed as typed: the run is confirmed
                await slow.type_keys(char)
                await slow.shows(rf"(?m)^name> {'12'[:at + 1]}$")
            await slow.echoed(r"(?m)^name> 12$")
            await slow.browser.evaluate("probe.reset(), true")
            await slow.type_keys("ab")
            await slow.shows(r"(?m)^name> 12AB$")
            middle[predict] = await slow.settled()
            log, _ = await slow.log()
            guessed = {d["char"] for state in log for d in state["decorations"]}
            assert guessed == ({"a", "b"} if predict == "always" else set()), guessed
            # Taken back as the server's "A" is drawn: at most the frame it takes.
            assert frames_contradicted(log) <= 1, log
            await slow.enter()
            await slow.shows(r"(?m)^secret:$")
            await slow.type_keys("x")
            await slow.enter()
            await slow.shows(r"(?m)^got=1\n\$$")
            slow.screens[predict] = await slow.settled()
        assert middle["always"] == middle["never"]
        assert slow.screens["always"] == slow.screens["never"]


async def test_vim_and_less_get_no_prediction(short_dir: Path) -> None:
    """On the alternate screen (vim's insert mode, less's search prompt) nothing is predicted,
    though the verdict is `application` and the latency rule says `always`."""
    async with slow_page(short_dir) as slow:
        alternate = "term.buffer.active.type === 'alternate'"
        normal = "term.buffer.active.type === 'normal'"
        for predict in ("never", "always"):
            await slow.open(predict)
            await slow.run_line("vim -u NONE -N -n -i NONE")
            await slow.browser.wait_for(alternate)
            await slow.shows(r"(?m)^~$")
            assert await slow.browser.evaluate(
                "[document.body.dataset.input, document.body.dataset.predict]",
            ) == ["application", "off"]
            await slow.browser.evaluate("probe.reset(), true")
            await slow.type_keys("i")
            await slow.shows(r"(?m)^-- INSERT --")
            for at in range(5):  # one at a time: echoes that would confirm a run
                await slow.type_keys("hello"[at])
                await slow.shows(rf"(?m)^{'hello'[:at + 1]}$")
            await slow.browser.press("Escape", "Escape", 27)
            await slow.type_keys(":q!")
            await slow.enter()
            await slow.browser.wait_for(normal)
            await slow.shows(r"(?m)^\$$")
            log, _ = await slow.log()
            assert all(not state["decorations"] and not state["cells"] for state in log), log

            await slow.run_line("seq 1 300 | less")
            await slow.browser.wait_for(alternate)
            await slow.shows(r"(?m)^:$")
            await slow.browser.evaluate("probe.reset(), true")
            for at in range(4):
                await slow.type_keys("/277"[at])
                await slow.shows(rf"(?m)^{'/277'[:at + 1]}$")
            await slow.enter()
            await slow.shows(r"(?m)^277$")
            await slow.type_keys("q")
            await slow.browser.wait_for(normal)
            await slow.shows(r"(?m)^\$$")
            log, _ = await slow.log()
            assert all(not state["decorations"] and not state["cells"] for state in log), log
            slow.screens[predict] = await slow.settled()
        assert slow.screens["always"] == slow.screens["never"]
