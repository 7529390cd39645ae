"""Key to screen in the browser page, predicted and not (protocol section 14): the page in
headless Chromium behind the tests' delaying proxy (tests/delays.py, 150 ms each way by
default), at bash's prompt, one key at a time; for each key the time from reaching the page
(`term.onData`) to its character being drawn in its cell (the DOM the person sees, the
predictor's decorations included), with `#predict=never` and with `#predict=auto`. The first
key of a run waits for its echo in both (the predictor's epochs): it is left out. Not a test;
run as `python -m benchmarks.predict_page [--delay-ms 150] [--keys 40]`."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import anyio

from .stats import median, percentile

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path[:0] = [str(TESTS), str(TESTS / "browser")]  # the tests' page harness and proxy

import helpers  # noqa: E402
from prediction import key_latencies, slow_page  # noqa: E402


async def measure(delay: float, count: int) -> dict[str, list[dict[str, object]]]:
    helpers.WORKERS = 1
    text = "echo " + ("abcdefghijklmnopqrstuvwxyz" * 4)[:count]
    found = {}
    with tempfile.TemporaryDirectory(prefix="tts-") as directory:
        async with slow_page(Path(directory), delay=delay) as slow:
            for predict in ("never", "auto"):
                await slow.open(predict)
                if predict == "auto":
                    await slow.browser.wait_for("document.body.dataset.predict === 'on'")
                row, col = await slow.browser.evaluate(
                    "[term.buffer.active.cursorY, term.buffer.active.cursorX]")
                await slow.browser.evaluate("probe.reset(), true")
                for at, char in enumerate(text):
                    await slow.type_keys(char)
                    if char != " ":
                        await slow.shows(rf"(?m)^\$ {text[:at + 1]}$")
                log, keys = await slow.log()
                found[predict] = key_latencies(log, keys[:len(text)],
                                               [(row, col + at) for at in range(len(text))])[1:]
                await slow.enter()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay-ms", type=float, default=150, help="each way (default 150)")
    parser.add_argument("--keys", type=int, default=40, help="keys typed (default 40)")
    options = parser.parse_args()
    found = anyio.run(measure, options.delay_ms / 1000, options.keys)
    print(f"key to screen, page behind a {options.delay_ms:g} ms each-way proxy "
          f"(round trip {2 * options.delay_ms:g} ms), bash's prompt, one key at a time")
    print(f"{'#predict':<10}{'keys':>6}{'predicted':>11}{'p50 ms':>9}{'p90 ms':>9}"
          f"{'max ms':>9}{'p50 frames':>12}")
    for predict, rows in found.items():
        ms = [float(r["ms"]) for r in rows]  # type: ignore[arg-type]
        frames = [float(r["frames"]) for r in rows]  # type: ignore[arg-type]
        shown = sum(bool(r["predicted"]) for r in rows)
        print(f"{predict:<10}{len(rows):>6}{shown:>11}{median(ms):>9.1f}"
              f"{percentile(ms, 90):>9.1f}{max(ms):>9.1f}{median(frames):>12.0f}")


if __name__ == "__main__":
    main()
