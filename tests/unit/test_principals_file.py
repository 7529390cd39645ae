"""The principals file (contracts.md, "One door to many hosts"): what it admits, what each
principal may reach, and a clear refusal for every file that cannot be used."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from ttyserve.errors import ConfigError, ErrorCode, RequestError
from ttyserve.server.auth import Access, Gate, Peer
from ttyserve.server.principals import load_principals

ALICE, CI = "alice-token", "ci-token"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "principals.toml"
    path.write_text(text)
    return str(path)


GOOD = f"""
[principals.alice]
token_sha256 = "{digest(ALICE)}"
targets = ["web-*", "role=db"]
[principals.ci]
token_sha256 = "{digest(CI).upper()}"
targets = ["env=staging"]
local = false
"""


def test_a_token_names_its_principal_and_what_it_may_reach(tmp_path: Path) -> None:
    principals = load_principals(write(tmp_path, GOOD))
    alice, ci = principals.named_by(ALICE), principals.named_by(CI)
    assert alice is not None and alice.name == "alice" and alice.local
    assert ci is not None and ci.name == "ci" and not ci.local
    assert principals.named_by("nobody's") is None and principals.named_by(None) is None
    assert alice.may_open("web-1", {}) and alice.may_open("db-0", {"role": "db"})
    assert not alice.may_open("db-0", {"role": "web"}) and not alice.may_open("mail", {})
    assert ci.may_open("x", {"env": "staging"}) and not ci.may_open("x", {"env": "prod"})


def test_with_principals_every_listener_asks_for_a_token_of_the_file(tmp_path: Path) -> None:
    gate = Gate(Access(token=None, principals=load_principals(write(tmp_path, GOOD))))
    unix = Peer("unix", uid=0, pid=1)
    assert gate.admit(unix, CI) == "ci"
    assert gate.admit(Peer("tcp", host="127.0.0.1"), ALICE) == "alice"
    for token in (None, "guess"):  # a uid alone is not enough
        with pytest.raises(RequestError) as refused:
            gate.admit(unix, token)
        assert refused.value.code == ErrorCode.UNAUTHORIZED
    assert gate.may_run_here("alice") and not gate.may_run_here("ci")


@pytest.mark.parametrize(("text", "says"), [
    ('[principals.a]\ntoken_sha256 = "%s"\nlocal = 1\n', "Expected `bool`"),
    ('[principals.a]\ntoken_sha256 = "%s"\ncolour = "red"\n', "unknown field `colour`"),
    ('[principals.a]\ntargets = ["x"]\n', "missing required field `token_sha256`"),
    ('[principals.a]\ntoken_sha256 = "abc"\n', "64 hex digits"),
    ('[principals.a]\ntoken_sha256 = "%s"\n[principals.a]\ntoken_sha256 = "%s"\n',
     "Cannot declare ('principals', 'a') twice"),
    ('[principals.a]\ntoken_sha256 = "%s"\n[principals.b]\ntoken_sha256 = "%s"\n',
     "have the same token"),
    ('[principals.a]\ntoken_sha256 = "%s"\ntargets = ["=prod"]\n', "is not label=value"),
    ('[principals.a]\ntoken_sha256 = "%s"\ntargets = ["web 1"]\n', "not a target name"),
    ('[principals."a b"]\ntoken_sha256 = "%s"\n', "a name is letters"),
    ('[people.a]\ntoken_sha256 = "%s"\n', "unknown field `people`"),
])
def test_a_file_that_cannot_be_used_is_refused_naming_what_is_wrong(
        tmp_path: Path, text: str, says: str) -> None:
    path = write(tmp_path, text.replace("%s", digest(ALICE)))
    with pytest.raises(ConfigError, match="principals file") as refused:
        load_principals(path)
    assert says in str(refused.value) and path in str(refused.value)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="No such file"):
        load_principals(str(tmp_path / "absent.toml"))
