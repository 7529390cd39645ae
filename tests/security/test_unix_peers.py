"""Hardening acceptance 1: a Unix-socket peer of another uid is refused unless allowed."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from helpers import start_server

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]


NOBODY_CLIENT = textwrap.dedent("""
    import json, socket, struct, sys
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(sys.argv[1])
    hello = json.dumps({"type": "hello", "protocol": 1}).encode()
    sock.sendall(struct.pack(">BII", 3, 0, len(hello)) + hello)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    print(json.loads(data[9:9 + struct.unpack(">I", data[5:9])[0]])["type"],
          json.loads(data[9:9 + struct.unpack(">I", data[5:9])[0]]).get("code"))
""")


def run_as_nobody(socket_path: Path) -> str:
    result = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
         "-c", NOBODY_CLIENT, str(socket_path)],
        capture_output=True, timeout=20, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another uid")
@pytest.mark.parametrize("allowed", [False, True])
def test_unix_peer_of_another_uid(short_dir: Path, allowed: bool) -> None:
    short_dir.chmod(0o755)
    extra = ["--allow-uid", "65534"] if allowed else []
    server = start_server(short_dir, *extra)
    try:
        (short_dir / "s.sock").chmod(0o666)  # let the file mode through: the uid check remains
        answer = run_as_nobody(short_dir / "s.sock")
    finally:
        server.stop()
    assert answer == ("welcome None" if allowed else "error unauthorized")
    if not allowed:
        assert "uid 65534 is not allowed" in server.stderr_tail()
