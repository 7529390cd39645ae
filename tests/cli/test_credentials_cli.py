"""`serve` and `exec` read tokens and TLS files the same way; each refuses with its own code."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from helpers import ServerProcess, start_server, ttyserve_command

from ttyserve.exitcodes import ExecExit, ServeExit

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]
TOKEN = "s3cret-token-for-tests"


@pytest.fixture
def pki(short_dir: Path) -> dict[str, Path]:
    """A CA made just now and a certificate it signed for 127.0.0.1, as PEM files."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    files = {name: short_dir / f"{name}.pem" for name in ("ca", "cert", "key")}
    ca.cert_pem.write_to_path(str(files["ca"]))
    cert.cert_chain_pems[0].write_to_path(str(files["cert"]))
    cert.private_key_pem.write_to_path(str(files["key"]))
    return files


def write_token(path: Path, content: str = TOKEN + "\n", mode: int = 0o600) -> Path:
    path.write_text(content)
    path.chmod(mode)
    return path


@pytest.fixture
def tls_server(short_dir: Path, pki: dict[str, Path]) -> Iterator[ServerProcess]:
    token = write_token(short_dir / "server-token")
    server = start_server(short_dir, "--token-file", str(token), "--tls-cert", str(pki["cert"]),
                          "--tls-key", str(pki["key"]), "--command", "/bin/sh",
                          listen=["tls:127.0.0.1:0"])
    try:
        yield server
    finally:
        server.stop()


def exec_cmd(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(ttyserve_command("exec", "--connect", address, *args),
                          capture_output=True, timeout=20, text=True, stdin=subprocess.DEVNULL)


def test_exec_over_tls_with_a_ca_file_and_a_private_token(tls_server: ServerProcess,
                                                          pki: dict[str, Path],
                                                          short_dir: Path) -> None:
    token = write_token(short_dir / "token")
    result = exec_cmd(tls_server.addresses[0], "--tls-ca", str(pki["ca"]), "--token-file",
                      str(token), "--", "sh", "-c", "echo over-tls")
    assert (result.returncode, result.stdout) == (0, "over-tls\n"), result.stderr


def test_exec_verifies_the_server_against_the_system_cas_by_default(
        tls_server: ServerProcess, short_dir: Path) -> None:
    token = write_token(short_dir / "token")
    result = exec_cmd(tls_server.addresses[0], "--token-file", str(token), "--", "true")
    assert result.returncode == ExecExit.FAILURE
    assert "CERTIFICATE_VERIFY_FAILED" in result.stderr


def test_exec_with_an_unusable_ca_file_exits_255_naming_it_and_does_not_retry(
        tls_server: ServerProcess, short_dir: Path) -> None:
    missing = short_dir / "no-ca.pem"
    token = write_token(short_dir / "token")
    result = exec_cmd(tls_server.addresses[0], "--tls-ca", str(missing), "--token-file",
                      str(token), "--retries", "3", "--", "true")
    assert result.returncode == ExecExit.FAILURE
    assert f"TLS CA file {missing}" in result.stderr
    assert "retrying" not in result.stderr


@pytest.mark.parametrize("kind", ["group-readable", "other-readable", "empty", "missing",
                                  "directory"])
def test_token_files_are_refused_alike_by_serve_3_and_exec_255(short_dir: Path,
                                                               kind: str) -> None:
    path = short_dir / "token"
    if kind == "directory":
        path.mkdir(mode=0o700)
    elif kind != "missing":
        mode = {"group-readable": 0o640, "other-readable": 0o604}.get(kind, 0o600)
        write_token(path, "" if kind == "empty" else TOKEN, mode)
    served = subprocess.run(ttyserve_command("serve", "--listen=tcp:127.0.0.1:0",
                                             "--token-file", str(path)),
                            capture_output=True, timeout=20, text=True)
    assert served.returncode == ServeExit.CONFIG
    assert f"token file {path}" in served.stderr
    executed = exec_cmd(f"unix:{short_dir / 'nobody.sock'}", "--token-file", str(path), "--",
                        "true")
    assert executed.returncode == ExecExit.FAILURE
    assert f"token file {path}" in executed.stderr
    assert "cannot connect" not in executed.stderr  # refused before connecting


@pytest.mark.parametrize("broken", ["cert", "key"])
def test_serve_with_an_unusable_tls_file_exits_3_naming_it(short_dir: Path,
                                                           pki: dict[str, Path],
                                                           broken: str) -> None:
    pki[broken].write_text("not PEM\n")
    token = write_token(short_dir / "token")
    result = subprocess.run(ttyserve_command("serve", "--listen=tls:127.0.0.1:0",
                                             "--token-file", str(token),
                                             "--tls-cert", str(pki["cert"]),
                                             "--tls-key", str(pki["key"])),
                            capture_output=True, timeout=20, text=True)
    assert result.returncode == ServeExit.CONFIG
    assert f"TLS certificate {pki['cert']} / key {pki['key']}" in result.stderr
