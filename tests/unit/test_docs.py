"""The docs' tables are the contract constants: a code added to one must reach the other."""

from __future__ import annotations

import re
from pathlib import Path

from ttyserve.errors import RETRIABLE, ErrorCode
from ttyserve.exitcodes import ExecExit, ServeExit
from ttyserve.protocol.frames import FrameKind

DOCS = Path(__file__).resolve().parents[2] / "docs"


def table_rows(text: str, first_cell: str) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and re.fullmatch(first_cell, cells[0]):
            rows.append(cells)
    return rows


def test_error_codes_table_matches_the_code() -> None:
    rows = table_rows((DOCS / "protocol.md").read_text(), r"`[a-z_]+`")
    documented = {row[0].strip("`"): row[2] for row in rows}
    by_carrier = {ErrorCode.TARGET_UNREACHABLE}  # retriable as its carrier's class says
    assert documented == {str(code): "as its carrier class" if code in by_carrier else
                          "yes" if code in RETRIABLE else "no" for code in ErrorCode}


def test_frame_kinds_table_matches_the_code() -> None:
    text = (DOCS / "protocol.md").read_text()
    rows = table_rows(text[text.index("| kind | name"):text.index("Channel 0 is")], r"\d")
    assert {int(row[0]): row[1] for row in rows} == {k.value: k.name for k in FrameKind}


def test_serve_exit_codes_table_matches_the_code() -> None:
    cli = (DOCS / "cli.md").read_text()
    serve = cli[cli.index("## `ttyserve serve`"):cli.index("## `ttyserve exec`")]
    assert {int(row[0]) for row in table_rows(serve, r"\d+")} == {int(c) for c in ServeExit}


def test_exec_exit_codes_table_matches_the_code() -> None:
    cli = (DOCS / "cli.md").read_text()
    execs = cli[cli.index("## `ttyserve exec`"):]
    documented = {row[0] for row in table_rows(execs, r"[\d.+S]+")}
    fixed = {str(int(c)) for c in ExecExit if c is not ExecExit.SIGNAL_BASE}
    assert documented == fixed | {"0..125", f"{int(ExecExit.SIGNAL_BASE)}+S"}


def test_the_docs_cite_no_file_the_repository_lacks() -> None:
    """A reader follows every path a page names: the design documents are kept beside the
    repository, so the pages name them, never a path into it that is not there."""
    root = DOCS.parent
    for page in [root / "README.md", *DOCS.glob("*.md")]:
        cited = re.findall(r"`((?:shared|docs|tests|ttyserve)/[\w./-]+\.\w+)`", page.read_text())
        for path in cited:
            assert (root / path.split("::")[0]).exists(), f"{page.name} cites {path}"
