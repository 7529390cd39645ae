"""The one token reader and the one TLS factory, on real files with real modes and certificates."""

from __future__ import annotations

import contextlib
import ssl
from pathlib import Path

import pytest
import trustme

from ttyserve.credentials import read_token, tls_context
from ttyserve.errors import ConfigError

# --- the token ---------------------------------------------------------------


def token_file(tmp_path: Path, content: bytes, mode: int = 0o600) -> Path:
    path = tmp_path / "token"
    path.write_bytes(content)
    path.chmod(mode)
    return path


def test_token_from_a_private_file_without_its_newline(tmp_path: Path) -> None:
    path = token_file(tmp_path, b"s3cret\n")
    assert read_token(str(path), {"TTYSERVE_TOKEN": "ignored"}) == "s3cret"
    assert read_token(str(token_file(tmp_path, b"s3cret", 0o400))) == "s3cret"


def test_without_a_file_the_environment_or_nothing() -> None:
    assert read_token(None, {"TTYSERVE_TOKEN": "from-env"}) == "from-env"
    assert read_token(None, {"TTYSERVE_TOKEN": ""}) is None
    assert read_token(None, {}) is None


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602, 0o610, 0o601, 0o666])
def test_a_file_open_to_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = token_file(tmp_path, b"s3cret\n", mode)
    with pytest.raises(ConfigError) as caught:
        read_token(str(path))
    assert str(caught.value).startswith(f"token file {path}: ")
    assert f"mode {mode:o}" in str(caught.value)


@pytest.mark.parametrize("kind, complaint", [
    ("empty", "is empty"),
    ("blank", "is empty"),
    ("missing", "No such file"),
    ("directory", "Is a directory"),
    ("binary", "not UTF-8"),
])
def test_an_unusable_file_is_refused_naming_it(tmp_path: Path, kind: str,
                                               complaint: str) -> None:
    path = tmp_path / "token"
    if kind == "directory":
        path.mkdir(mode=0o700)
    elif kind != "missing":
        token_file(tmp_path, {"empty": b"", "blank": b" \n\t\n", "binary": b"\xff\xfe"}[kind])
    with pytest.raises(ConfigError) as caught:
        read_token(str(path))
    assert str(caught.value).startswith(f"token file {path}")
    assert complaint in str(caught.value)


# --- TLS -----------------------------------------------------------------------


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, str]:
    """A CA made just now and a certificate for localhost signed by it, as PEM files."""
    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    files = {name: str(tmp_path / f"{name}.pem") for name in ("ca", "cert", "key")}
    ca.cert_pem.write_to_path(files["ca"])
    cert.private_key_and_cert_chain_pem.write_to_path(files["cert"])
    cert.private_key_pem.write_to_path(files["key"])
    return files


def handshake(server: ssl.SSLContext, client: ssl.SSLContext,
              hostname: str = "localhost") -> str | None:
    """Run a TLS handshake between the two contexts in memory; the version agreed."""
    wires = {side: (ssl.MemoryBIO(), ssl.MemoryBIO()) for side in ("server", "client")}
    ends = {
        "server": server.wrap_bio(*wires["server"], server_side=True),
        "client": client.wrap_bio(*wires["client"], server_hostname=hostname),
    }
    done: set[str] = set()
    for _ in range(10):
        for side, peer in (("client", "server"), ("server", "client")):
            with contextlib.suppress(ssl.SSLWantReadError):  # it waits for the other side
                ends[side].do_handshake()
                done.add(side)
            wires[peer][0].write(wires[side][1].read())  # what one side sent, the other reads
        if done == {"client", "server"}:
            return ends["client"].version()
    raise AssertionError("the handshake did not finish")


def test_server_and_client_contexts_agree_on_tls_1_2_or_later(pki: dict[str, str]) -> None:
    server = tls_context("server", certfile=pki["cert"], keyfile=pki["key"])
    client = tls_context("client", cafile=pki["ca"])
    assert server.minimum_version == client.minimum_version == ssl.TLSVersion.TLSv1_2
    assert client.verify_mode == ssl.CERT_REQUIRED and client.check_hostname
    assert handshake(server, client) in ("TLSv1.2", "TLSv1.3")


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated")
def test_the_server_refuses_a_client_older_than_tls_1_2(pki: dict[str, str]) -> None:
    server = tls_context("server", certfile=pki["cert"], keyfile=pki["key"])
    old = tls_context("client", cafile=pki["ca"])
    old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    old.maximum_version = ssl.TLSVersion.TLSv1_1
    old.set_ciphers("DEFAULT:@SECLEVEL=0")  # OpenSSL's own floor would refuse 1.1 on its own
    with pytest.raises(ssl.SSLError, match="UNSUPPORTED_PROTOCOL"):
        handshake(server, old)


def test_the_client_verifies_the_certificate_and_the_name(pki: dict[str, str]) -> None:
    server = tls_context("server", certfile=pki["cert"], keyfile=pki["key"])
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server, tls_context("client"))  # the system's CAs never signed it
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server, tls_context("client", cafile=pki["ca"]), hostname="elsewhere.example")


def test_a_server_needs_both_certificate_and_key(pki: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="certificate and a key"):
        tls_context("server", certfile=pki["cert"])
    with pytest.raises(ConfigError, match="certificate and a key"):
        tls_context("server", keyfile=pki["key"])


@pytest.mark.parametrize("certfile, keyfile", [
    ("missing", "key"), ("cert", "missing"), ("garbage", "key"), ("cert", "ca"),
])
def test_unusable_server_files_are_named(pki: dict[str, str], tmp_path: Path, certfile: str,
                                         keyfile: str) -> None:
    files = {**pki, "missing": str(tmp_path / "missing.pem"),
             "garbage": str(tmp_path / "garbage.pem")}
    Path(files["garbage"]).write_text("not a certificate\n")
    with pytest.raises(ConfigError) as caught:
        tls_context("server", certfile=files[certfile], keyfile=files[keyfile])
    assert f"TLS certificate {files[certfile]} / key {files[keyfile]}: " in str(caught.value)


@pytest.mark.parametrize("content", [None, "not a certificate\n"])
def test_an_unusable_ca_file_is_named(tmp_path: Path, content: str | None) -> None:
    cafile = tmp_path / "ca.pem"
    if content is not None:
        cafile.write_text(content)
    with pytest.raises(ConfigError) as caught:
        tls_context("client", cafile=str(cafile))
    assert str(caught.value).startswith(f"TLS CA file {cafile}: ")
