"""Every example in docs/ is checked as written (issue 41): most need hosts, clusters or
service managers this machine has not, so each is checked as far as it can be without
them. A `ttyserve ...` command line parses with the real parser (its command and every
flag exist and take what is given); a TOML block is a principals or targets file the
server accepts; a Python block compiles. The README's own examples run
(tests/cli/test_readme_examples.py), and docs/http.md's recipes too (tests/api)."""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

import pytest

from ttyserve.cli.main import parse_arguments
from ttyserve.server.principals import load_principals
from ttyserve.server.targets.config import load_targets

DOCS = Path(__file__).resolve().parents[2] / "docs"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(language: str) -> list[tuple[str, str]]:
    """(page, text) of every fenced block of ``language`` in docs/."""
    return [(page.name, text) for page in sorted(DOCS.glob("*.md"))
            for found, text in BLOCK.findall(page.read_text()) if found == language]


def command_lines() -> list[tuple[str, str]]:
    """Each `ttyserve ...` command of the shell blocks (and of the plain ones, but for a
    usage synopsis's `[...]`), its continuations joined and its shell around it (pipes,
    redirections, `$(...)`) left out."""
    found = []
    for page, text in [*blocks("sh"), *blocks("")]:
        joined = re.sub(r"\\\n\s*", " ", text)
        for line in joined.splitlines():
            line = line.split(" #", 1)[0].strip()
            if re.search(r" \[-[^]]*\]", line):
                continue  # (a synopsis, not a command)
            match = re.search(r"(?:^|[;&|(]\s*|\bexec\s+)(?:\S*/)?ttyserve\s+(\S.*)", line)
            if match is not None:
                found.append((page, re.split(r"\s(?:\||;|&&|>|<|2>)\s?", match.group(1))[0]))
    return found


def test_there_are_examples_to_check() -> None:
    assert len(command_lines()) >= 25 and blocks("toml") and blocks("python")


@pytest.mark.parametrize(("page", "command"), command_lines())
def test_a_command_line_of_the_docs_parses(page: str, command: str) -> None:
    words = shlex.split(re.sub(r"\$\([^)]*\)|\$\w+|\$\{\w+\}", "X", command))
    try:
        parse_arguments(words)
    except SystemExit as exc:  # (argparse's way to say a usage error)
        pytest.fail(f"{page}: `ttyserve {command}` does not parse (exit {exc.code})")


@pytest.mark.parametrize(("page", "text"), blocks("toml"))
def test_a_toml_example_is_a_file_the_server_takes(page: str, text: str,
                                                   tmp_path: Path) -> None:
    path = tmp_path / "example.toml"
    path.write_text(text)
    if "[principals." in text:
        assert len(load_principals(str(path))) >= 1, page
    elif "[targets." in text:
        assert len(load_targets(str(path))) >= 1, page
    else:
        pytest.fail(f"{page}: a TOML block that is neither a principals nor a targets file")


@pytest.mark.parametrize(("page", "text"), blocks("python"))
def test_a_python_example_compiles(page: str, text: str) -> None:
    compile(text, f"{page} example", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


@pytest.mark.parametrize(("page", "text"), blocks("json"))
def test_a_json_example_parses(page: str, text: str) -> None:
    try:
        json.loads(text)
    except json.JSONDecodeError:  # JSON lines, then: each one
        for line in text.splitlines():
            json.loads(line)
