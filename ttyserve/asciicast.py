"""asciicast v3 (what `serve --record` writes) to v2 (what asciinema 2.x reads): lines in,
lines out, no I/O, so the rules are tested without a file.

v3 times are intervals since the previous event, v2's are seconds since the start; v3's
header holds the terminal as `term.cols/rows/type`, v2's as `width`, `height`, `env.TERM`.
v2 has no exit event: v3's `"x"` becomes a marker `exit CODE`. Comments (`#` lines) and
`term.version` have no place in v2 and are dropped; every other event and header member is
kept as it is. Specs: https://docs.asciinema.org/manual/asciicast/v3/ and .../v2/.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .errors import RecordingError

MICROS = 1_000_000  # v2 times are written to the microsecond, as asciinema 2.x writes them
EXIT_MARKER = "exit "  # v3's `[t, "x", "CODE"]` is v2's `[T, "m", "exit CODE"]`


def _json(value: object) -> str:
    """ASCII-only JSON, DEL escaped too: every non-printable code point escaped, as both
    specs ask (json.dumps leaves DEL alone)."""
    return json.dumps(value).replace("\x7f", "\\u007f")


def v2_header(header: dict[str, Any]) -> dict[str, Any]:
    """The v2 header for a v3 one: `term.cols/rows` as `width/height`, `term.type` as
    `env.TERM`, `term.theme` as `theme`; `term.version` dropped, the other members kept.
    Raises RecordingError when it is not a v3 header."""
    version = header.get("version")
    if version != 3:
        if version == 2:
            raise RecordingError("already asciicast v2: nothing to convert", 1)
        raise RecordingError(f"the header says version {_json(version)}, not 3: not an "
                             f"asciicast v3 recording", 1)
    term = header.get("term")
    if not (isinstance(term, dict) and _count(cols := term.get("cols"))
            and _count(rows := term.get("rows"))):
        raise RecordingError("the header has no term.cols and term.rows (whole numbers "
                             "above 0)", 1)
    converted: dict[str, Any] = {"version": 2, "width": cols, "height": rows}
    converted.update((key, value) for key, value in header.items()
                     if key not in ("version", "term", "env", "theme"))
    env = header.get("env")
    if isinstance(term.get("type"), str):
        env = {**(env if isinstance(env, dict) else {}), "TERM": term["type"]}
    if env is not None:
        converted["env"] = env
    if (theme := term.get("theme", header.get("theme"))) is not None:
        converted["theme"] = theme
    return converted


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


class ToV2:
    """One v3 recording turned into v2, a line at a time: `feed` each line as a file gives
    it (with its newline), then `finish`. ``cut`` is the number of a cut last line, dropped
    (a server that crashed leaves one: no newline, not JSON)."""

    def __init__(self) -> None:
        self.number = 0  # lines fed
        self.cut: int | None = None
        self._micros = 0  # the time of the last event, in µs since the start

    def feed(self, line: str) -> str | None:
        """The v2 line (with its newline) for one v3 line, None for a line v2 has no place
        for (a comment, a blank line, a cut last line). Raises RecordingError."""
        self.number += 1
        text = line.strip()
        if self.number > 1 and (not text or text.startswith("#")):
            return None
        try:
            value = json.loads(text)
        except ValueError:
            if self.number > 1 and not line.endswith("\n"):
                self.cut = self.number
                return None
            what = "a header" if self.number == 1 else "an event"
            raise RecordingError(f"not JSON: not {what} of an asciicast v3 recording",
                                 self.number) from None
        if self.number == 1:
            if not isinstance(value, dict):
                raise RecordingError("the first line is not a JSON object: not an asciicast "
                                     "recording", 1)
            return _json(v2_header(value)) + "\n"
        return self._event(value)

    def finish(self) -> None:
        """The input ended: raises RecordingError if it held no header."""
        if self.number == 0:
            raise RecordingError("empty: not an asciicast recording")

    def _event(self, value: object) -> str:
        if not (isinstance(value, list) and len(value) == 3):
            raise RecordingError("not an event [interval, code, data]", self.number)
        interval, code, data = value
        if (not isinstance(interval, int | float) or isinstance(interval, bool)
                or not math.isfinite(interval) or interval < 0):
            raise RecordingError(f"the interval {_json(interval)} is not a number of "
                                 f"seconds, 0 or more", self.number)
        if not (isinstance(code, str) and code and isinstance(data, str)):
            raise RecordingError("not an event [interval, code, data]: code and data are "
                                 "strings", self.number)
        # Whole µs added up: a long recording's sum does not drift as floats' would.
        self._micros += round(interval * MICROS)
        seconds, micros = divmod(self._micros, MICROS)
        if code == "x":
            code, data = "m", EXIT_MARKER + data
        return f"[{seconds}.{micros:06d}, {_json(code)}, {_json(data)}]\n"
