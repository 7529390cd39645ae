"""Shell completion for bash and zsh and the man page (issue 41), generated from the parser
(scripts/shell_files.py): share/ is what the parser makes now, and each file works where it
is used: bash completes commands and a command's flags, zsh reads its file, groff renders
the page with every command in it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ttyserve.cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
SHARE = ROOT / "share"
pytestmark = pytest.mark.timeout(60)


def need(program: str, package: str) -> str:
    path = shutil.which(program)
    if path is None:
        pytest.skip(f"{program} is not installed (apt-get install {package})")
    return path


def test_share_is_what_the_parser_makes() -> None:
    checked = subprocess.run([sys.executable, "-m", "scripts.shell_files", "--check"],
                             cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr


def complete(*words: str) -> list[str]:
    """What bash's completion offers for the last of ``words`` (a real bash, the file
    sourced as a user's .bashrc would)."""
    before = words[-2] if len(words) > 1 else "ttyserve"
    script = (f"source {SHARE / 'completions' / 'ttyserve.bash'}; "
              f"COMP_WORDS=(ttyserve {' '.join(words)}); COMP_CWORD={len(words)}; "
              f"_shtab_ttyserve ttyserve {words[-1]} {before}; "
              'printf "%s\\n" "${COMPREPLY[@]}"')
    done = subprocess.run([need("bash", "bash"), "-c", script], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_bash_completes_commands_and_flags() -> None:
    assert set(complete("")) >= set(COMMANDS)
    assert complete("ki") == ["kill"]
    assert "--signal" in complete("kill", "--sig")
    assert "--detachable" in complete("exec", "--det")


def test_zsh_reads_its_completion() -> None:
    zsh = need("zsh", "zsh")
    file = SHARE / "completions" / "_ttyserve"
    checked = subprocess.run([zsh, "-n", str(file)], capture_output=True, text=True,
                             timeout=30)
    assert checked.returncode == 0, checked.stderr
    loaded = subprocess.run([zsh, "-fc", f"fpath=({file.parent} $fpath); autoload -Uz "
                             "_ttyserve; whence -w _ttyserve"], capture_output=True,
                            text=True, timeout=30)
    assert loaded.stdout.strip() == "_ttyserve: function", loaded.stderr
    assert all(f"\n    {command}:" in file.read_text() for command in COMMANDS)


def test_the_man_page_renders_with_every_command() -> None:
    groff = need("groff", "groff-base")
    rendered = subprocess.run([groff, "-man", "-Tutf8", "-ww", "-P-cbou",  # (plain text)
                               str(SHARE / "man" / "man1" / "ttyserve.1")],
                              capture_output=True, text=True, timeout=30)
    assert rendered.returncode == 0 and rendered.stderr == "", rendered.stderr
    text = rendered.stdout.replace("\u2010", "-")
    assert all(f"ttyserve {command}" in text for command in COMMANDS)
    assert "--signal" in text and "--detachable" in text
