"""The warm server's name carries a digest of the installed code (cli/warm.py): every
module's change reaches it, in any sub-package, and nothing outside the modules does."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ttyserve.cli.warm import code_digest

PACKAGE = Path(code_digest.__code__.co_filename).parent.parent


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / "ttyserve"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("*.pyc"))
    return copy


def test_a_changed_module_anywhere_changes_the_digest(tmp_path: Path) -> None:
    package = _copy(tmp_path)
    first = code_digest(str(package))
    assert code_digest(str(package)) == first  # the same installation, the same name
    module = package / "server" / "sessions" / "life.py"
    stat = module.stat()
    os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert code_digest(str(package)) != first
    (package / "server" / "sessions" / "new_module.py").write_text("")
    assert code_digest(str(package)) != first


def test_what_is_not_a_module_leaves_the_digest_alone(tmp_path: Path) -> None:
    package = _copy(tmp_path)
    first = code_digest(str(package))
    (package / "__pycache__").mkdir(exist_ok=True)
    (package / "__pycache__" / "stale.py").write_text("")  # (never imported from there)
    (package / "web" / "static" / "extra.py").write_text("")
    (package / "server" / "notes.txt").write_text("")
    assert code_digest(str(package)) == first
