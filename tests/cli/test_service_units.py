"""The systemd units the repository ships (deploy/systemd/): `systemd-analyze verify` accepts
them as they are, in a mount namespace where their ExecStart= path exists (a tmpfs over
/usr/local/bin holding a link to this checkout's ttyserve)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
VERIFY = shutil.which("systemd-analyze")
pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(VERIFY is None, reason="systemd-analyze is not installed: apt-get "
                       "install systemd"),
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                       reason="root or unshare is not installed here: verifying the units "
                              "needs a mount namespace for their ExecStart= path (CI has "
                              "them)"),
]


def test_systemd_analyze_verify_accepts_the_units(tmp_path: Path) -> None:
    units = sorted(UNITS.glob("ttyserve*"))
    assert {u.name for u in units} == {"ttyserve.service", "ttyserve.socket",
                                       "ttyserve-web.socket"}
    for unit in units:  # (verify reads a unit's neighbours from its own directory)
        shutil.copy(unit, tmp_path)
    ttyserve = Path(sys.executable).parent / "ttyserve"
    script = ("mount -t tmpfs ttyserve-units /usr/local/bin && "
              f"ln -s {ttyserve} /usr/local/bin/ttyserve && "
              f"{VERIFY} verify " + " ".join(u.name for u in units))
    result = subprocess.run(["unshare", "--mount", "sh", "-c", script], cwd=tmp_path,
                            capture_output=True, text=True, timeout=30)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_verify_refuses_what_the_old_snippet_had(tmp_path: Path) -> None:
    """The check is real: a comment at the end of a line, as docs/containment.md once had,
    is refused."""
    unit = tmp_path / "ttyserve.service"
    text = (UNITS / "ttyserve.service").read_text().replace(
        "KillMode=mixed", "KillMode=mixed        # stop: SIGTERM to the server")
    unit.write_text(text)
    result = subprocess.run([VERIFY or "", "verify", unit.name], cwd=tmp_path,
                            capture_output=True, text=True, timeout=30)
    assert "kill mode" in (result.stdout + result.stderr).lower()
