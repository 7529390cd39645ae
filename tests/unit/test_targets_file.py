"""The targets file (contracts.md, "One door to many hosts"): each target's carrier address,
labels and remote command, and a clear refusal, naming the file and the target, for every
file that cannot be used."""

from __future__ import annotations

from pathlib import Path

import pytest

from ttyserve.errors import ConfigError
from ttyserve.server.targets.config import load_targets


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "targets.toml"
    path.write_text(text)
    return str(path)


def test_targets_are_read_with_their_defaults(tmp_path: Path) -> None:
    targets = load_targets(write(tmp_path, """
[targets.web-1]
via = "ssh://deploy@web-1.internal:2222"
labels = { env = "prod", role = "web" }
[targets.db-0]
via = "via:kubectl exec -i -n prod db-0 --"
remote_command = "/opt/ttyserve/bin/ttyserve"
persist = false
"""))
    web, db = targets.get("web-1"), targets.get("db-0")
    assert web is not None and db is not None and len(targets) == 2
    assert (web.address.scheme, web.address.user, web.address.host, web.address.port) == (
        "ssh", "deploy", "web-1.internal", 2222)
    assert web.labels == {"env": "prod", "role": "web"} and web.remote_command == "ttyserve"
    assert web.persist and not db.persist
    assert db.address.command == ("kubectl", "exec", "-i", "-n", "prod", "db-0", "--")
    assert db.remote_command == "/opt/ttyserve/bin/ttyserve"


@pytest.mark.parametrize(("text", "said"), [
    ('[targets.a]\nvia = "via:true"\nport = 3\n', "unknown field `port`"),
    ('[targets.a]\nvia = "via:true"\n[targets.a]\nvia = "via:false"\n', "a"),
    ('[targets.a]\nlabels = {}\n', "missing required field `via`"),
    ('[targets.a]\nvia = "tcp:127.0.0.1:7022"\n', "not reached through a carrier"),
    ('[targets.a]\nvia = "ssh://"\n', "target 'a': via"),
    ('[targets."a b"]\nvia = "via:true"\n', "a name is letters"),
    ('[targets.a]\nvia = "via:true"\nlabels = { "x=y" = "z" }\n', "label 'x=y'"),
    ('[targets.a]\nvia = "via:true"\nremote_command = " "\n', "remote_command is empty"),
    ('[targets.a\n', "targets file"),
])
def test_a_file_that_cannot_be_used_says_what_is_wrong(
        tmp_path: Path, text: str, said: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as refused:
        load_targets(path)
    assert f"targets file {path}" in str(refused.value) and said in str(refused.value)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="No such file"):
        load_targets(str(tmp_path / "nowhere.toml"))
