"""Install as the README says: the wheel and the sdist built with `python -m build`, the wheel
installed into a fresh virtual environment, and `ttyserve --version` and an `exec` run
through that installation alone (its server too), with the page's assets in it."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from helpers import wait_for_line

from ttyserve.version import __version__

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)


def test_the_built_wheel_installs_and_runs(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)],
                           capture_output=True, text=True, timeout=240)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = dist.glob("ttyserve-*-py3-none-any.whl")
    (sdist,) = dist.glob("ttyserve-*.tar.gz")
    assert wheel.name == f"ttyserve-{__version__}-py3-none-any.whl" and sdist.stat().st_size
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {"ttyserve/web/static/ttyserve.js", "ttyserve/web/static/vendor/xterm.mjs",
            "ttyserve/py.typed"} <= names

    home = tmp_path / "env"
    venv.create(home, with_pip=True)
    installed = subprocess.run([str(home / "bin" / "pip"), "install", "--quiet", str(wheel)],
                               capture_output=True, text=True, timeout=240)
    assert installed.returncode == 0, installed.stderr[-2000:]
    ttyserve = str(home / "bin" / "ttyserve")
    environ = {key: value for key, value in os.environ.items()
               if not key.startswith(("PYTHON", "VIRTUAL_ENV"))}
    version = subprocess.run([ttyserve, "--version"], capture_output=True, text=True,
                             timeout=30, env=environ)
    assert version.stdout.strip() == f"ttyserve {__version__}", version.stderr

    address = f"unix:{tmp_path / 's.sock'}"
    server = subprocess.Popen([ttyserve, "serve", "--workers", "1", "--listen", address],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environ,
                              cwd=tmp_path)
    try:
        assert wait_for_line(server, 30) == f"listening {address}\n".encode()
        ran = subprocess.run([ttyserve, "exec", "--connect", address, "--", "sh", "-c",
                              "echo from the wheel; exit 3"], capture_output=True,
                             timeout=60, env={**environ, "TTYSERVE_WARM": "0"}, cwd=tmp_path)
        assert (ran.returncode, ran.stdout) == (3, b"from the wheel\n"), ran.stderr
        served_from = Path(f"/proc/{server.pid}/cmdline").read_bytes()
        assert str(home).encode() in served_from  # this installation's, not the checkout's
    finally:
        server.terminate()
        assert server.wait(30) == 0
        for stream in (server.stdout, server.stderr):
            assert stream is not None
            stream.close()
