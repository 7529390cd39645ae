"""Shell completion (bash, zsh) and the man page, generated from the command line's own
parser (shtab, argparse-manpage), so they say exactly what the parser takes.

    .venv/bin/python -m scripts.shell_files          # writes share/
    .venv/bin/python -m scripts.shell_files --check  # exit 1 if share/ is not up to date

`tests/cli/test_shell_files.py` runs the check, and tries each file for real.
"""

from __future__ import annotations

import sys
from pathlib import Path

import shtab
from argparse_manpage.manpage import Manpage

from ttyserve.cli.main import build_parser
from ttyserve.version import __version__

SHARE = Path(__file__).resolve().parents[1] / "share"
FILES = {
    "completions/ttyserve.bash": lambda: shtab.complete(build_parser(), shell="bash"),
    "completions/_ttyserve": lambda: shtab.complete(build_parser(), shell="zsh"),
    "man/man1/ttyserve.1": lambda: str(Manpage(build_parser(), _data={
        "project_name": "ttyserve", "version": __version__, "date": __version__,
        "manual_title": "ttyserve manual", "url": "docs/cli.md in the repository"})),
}


def generated() -> dict[str, str]:
    """Each file's path under share/ and its text, made from the parser now."""
    return {path: make() for path, make in FILES.items()}


def main(argv: list[str]) -> int:
    stale = []
    for path, text in generated().items():
        target = SHARE / path
        if "--check" in argv:
            if not target.exists() or target.read_text() != text:
                stale.append(path)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    for path in stale:
        sys.stderr.write(f"share/{path} is not what the parser makes: run "
                         ".venv/bin/python -m scripts.shell_files\n")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
