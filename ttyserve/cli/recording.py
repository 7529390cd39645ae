"""`ttyserve recording convert --to v2 FILE [-o OUT]`: a recording of `serve --record`
(asciicast v3) as asciicast v2, for the asciinema 2.x that distributions ship, which
refuses v3. The rules are `ttyserve.asciicast`'s; this module reads, writes and says."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator
from typing import TextIO

from ..asciicast import ToV2
from ..errors import RecordingError
from ..exitcodes import RecordingExit

PROG = "ttyserve recording convert"


class _Failed(Exception):
    """Nothing was converted; the message names the file and what is wrong with it."""


def convert_main(path: str, out: str | None) -> int:
    """Convert FILE to v2 into OUT (all or nothing), or to stdout without one."""
    try:
        with open(path, encoding="utf-8") as source:
            lines = _v2_lines(source, path)
            if out is None:
                _to_stdout(lines)
            else:
                _replace(out, lines)
    except _Failed as exc:
        sys.stderr.write(f"{PROG}: {exc}\n")
        return RecordingExit.NOT_CONVERTED
    except OSError as exc:  # FILE could not be opened
        sys.stderr.write(f"{PROG}: {path}: {exc.strerror or exc}\n")
        return RecordingExit.NOT_CONVERTED
    return RecordingExit.OK


def _v2_lines(source: TextIO, path: str) -> Iterator[str]:
    """The v2 lines of the v3 recording ``source``; raises _Failed naming PATH (and the line)."""
    conversion = ToV2()
    try:
        for line in source:
            if (converted := conversion.feed(line)) is not None:
                yield converted
        conversion.finish()
    except RecordingError as exc:
        where = path if exc.line is None else f"{path}:{exc.line}"
        raise _Failed(f"{where}: {exc.message}") from exc
    except UnicodeDecodeError as exc:
        raise _Failed(f"{path}: not UTF-8 text: not an asciicast recording") from exc
    except OSError as exc:
        raise _Failed(f"{path}: {exc.strerror or exc}") from exc
    if conversion.cut is not None:
        sys.stderr.write(f"{PROG}: {path}:{conversion.cut}: dropped the cut last line (what "
                         f"a server that crashed while recording leaves)\n")


def _replace(out: str, lines: Iterable[str]) -> None:
    """Write ``lines`` to a new file beside OUT (mode 0600, as recordings are) and rename it
    over OUT once all are written: a failure leaves OUT as it was."""
    try:
        fd, temp = tempfile.mkstemp(dir=os.path.dirname(out) or ".",
                                    prefix=f".{os.path.basename(out)}.", suffix=".tmp")
    except OSError as exc:
        raise _Failed(f"cannot write {out}: {exc.strerror or exc}") from exc
    try:
        with open(fd, "w", encoding="utf-8") as file:
            file.writelines(lines)
            file.flush()
            os.fsync(file.fileno())  # the rename must not land before the data
        os.replace(temp, out)
    except OSError as exc:  # (reading FILE fails as _Failed)
        raise _Failed(f"cannot write {out}: {exc.strerror or exc}") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)  # left only by a failure


def _to_stdout(lines: Iterable[str]) -> None:
    try:
        sys.stdout.writelines(lines)
        sys.stdout.flush()
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):  # nobody reads: no second error at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise _Failed(f"cannot write to stdout: {exc.strerror or exc}") from exc
