"""Hardening: every flag has an environment variable and a TOML key; bad ones exit 3 by name."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import msgspec
import pytest
from helpers import start_server, ttyserve_command

from ttyserve.errors import ConfigError, UsageError
from ttyserve.exitcodes import ServeExit
from ttyserve.server import config
from ttyserve.server.settings import ServerSettings, options

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("workers")]


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return parser.parse_args(list(flags))


def test_every_option_has_a_flag_an_env_and_a_key() -> None:
    fields = {f.name for f in msgspec.structs.fields(ServerSettings)}
    assert set(options()) == fields - {"token", "default_cwd"}  # the two that are not options
    help_text = subprocess.run(ttyserve_command("serve", "--help"), capture_output=True,
                               text=True, timeout=20).stdout
    for key in options():
        assert config.flag(key) in help_text


@pytest.mark.parametrize("given, name", [
    ({"max_sessions": 0}, "max_sessions"),
    ({"linger": -1.0}, "linger"),
    ({"spawn": "fork"}, "spawn"),
    ({"listen": "unix:/a"}, "listen"),
    ({"command": ""}, "command"),
    ({"allow_origin": ["not an origin"]}, "allow_origin"),
])
def test_a_program_building_the_settings_gets_the_same_validation(
        given: dict[str, object], name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        ServerSettings(**given)  # type: ignore[arg-type]


def test_the_command_is_split_as_a_shell_splits_words_or_taken_as_argv() -> None:
    assert ServerSettings(command="bash -c 'echo hi'").default_argv == ["bash", "-c", "echo hi"]
    assert ServerSettings(command=["a b", "c"]).default_argv == ["a b", "c"]
    assert ServerSettings().default_argv[-1] == "-l"  # the login shell


def test_precedence_flag_env_file_default(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text('linger = 5.0\nmax_sessions = 7\nshutdown_timeout = 9\n'
                    'listen = ["unix:/a"]\n')
    loaded = config.load(parse("--config", str(file), "--linger", "1"),
                         {"TTYSERVE_LINGER": "3", "TTYSERVE_MAX_SESSIONS": "8"})
    assert (loaded.linger, loaded.max_sessions, loaded.shutdown_timeout) == (1.0, 8, 9.0)
    assert loaded.listen == ["unix:/a"]
    assert config.load(parse(), {}).max_sessions == 1024


def test_env_lists_and_booleans() -> None:
    loaded = config.load(parse(), {"TTYSERVE_ALLOW_UID": "1, 2", "TTYSERVE_INSECURE": "true",
                                   "TTYSERVE_LISTEN": "unix:/a tcp:127.0.0.1:1"})
    assert (loaded.allow_uid, loaded.insecure) == ([1, 2], True)
    assert loaded.listen == ["unix:/a", "tcp:127.0.0.1:1"]


@pytest.mark.parametrize("toml, key", [
    ("nonsense = 1", "nonsense"),
    ('max_sessions = "many"', "max_sessions"),
    ("max_sessions = 0", "max_sessions"),
    ("linger = -1", "linger"),
    ('listen = "unix:/a"', "listen"),
    ("max_frame = 10", "max_frame"),
    ("this is not toml", "c.toml"),
])
def test_bad_config_file_exits_3_naming_the_key(short_dir: Path, toml: str, key: str) -> None:
    file = short_dir / "c.toml"
    file.write_text(toml + "\n")
    result = subprocess.run(ttyserve_command("serve", "--config", str(file)),
                            capture_output=True, timeout=20, text=True)
    assert result.returncode == ServeExit.CONFIG
    assert key in result.stderr


@pytest.mark.parametrize("env, name", [
    ({"TTYSERVE_MAX_CONNECTIONS": "x"}, "TTYSERVE_MAX_CONNECTIONS"),
    ({"TTYSERVE_INSECURE": "maybe"}, "TTYSERVE_INSECURE"),
    ({"TTYSERVE_HANDSHAKE_TIMEOUT": "0"}, "TTYSERVE_HANDSHAKE_TIMEOUT"),
])
def test_bad_environment_exits_3_naming_it(env: dict[str, str], name: str) -> None:
    import os

    result = subprocess.run(ttyserve_command("serve"), capture_output=True, timeout=20,
                            text=True, env={**os.environ, **env})
    assert result.returncode == ServeExit.CONFIG
    assert name in result.stderr


def test_bad_flag_value_is_a_usage_error() -> None:
    result = subprocess.run(ttyserve_command("serve", "--max-sessions", "0"),
                            capture_output=True, timeout=20, text=True)
    assert result.returncode == ServeExit.USAGE
    assert "--max-sessions" in result.stderr


@pytest.mark.parametrize("listen, extra, complaint", [
    ("tcp:127.0.0.1:0", [], "need a token"),
    ("tcp:0.0.0.0:0", ["--token-file", "TOKEN"], "needs TLS"),
    ("tls:127.0.0.1:0", ["--token-file", "TOKEN"], "--tls-cert"),
])
def test_exposure_is_refused_by_default(short_dir: Path, listen: str, extra: list[str],
                                        complaint: str) -> None:
    token = short_dir / "token"
    token.write_text("t")
    token.chmod(0o600)
    args = [str(token) if a == "TOKEN" else a for a in extra]
    result = subprocess.run(ttyserve_command("serve", f"--listen={listen}", *args),
                            capture_output=True, timeout=20, text=True)
    assert result.returncode == ServeExit.CONFIG
    assert complaint in result.stderr


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o644])
def test_token_file_open_to_others_is_refused(short_dir: Path, mode: int) -> None:
    token = short_dir / "token"
    token.write_text("t")
    token.chmod(mode)
    result = subprocess.run(ttyserve_command("serve", "--listen=tcp:127.0.0.1:0",
                                             "--token-file", str(token)),
                            capture_output=True, timeout=20, text=True)
    assert result.returncode == ServeExit.CONFIG
    assert f"token file {token}" in result.stderr and "chmod 600" in result.stderr


@pytest.mark.parametrize("kind", ["empty", "directory", "missing"])
def test_unusable_token_file_exits_3_naming_it(short_dir: Path, kind: str) -> None:
    token = short_dir / "token"
    if kind == "empty":
        token.write_text("\n")
        token.chmod(0o600)
    elif kind == "directory":
        token.mkdir(mode=0o700)
    result = subprocess.run(ttyserve_command("serve", "--listen=tcp:127.0.0.1:0",
                                             "--token-file", str(token)),
                            capture_output=True, timeout=20, text=True)
    assert result.returncode == ServeExit.CONFIG
    assert f"token file {token}" in result.stderr


@pytest.mark.parametrize("source", ["file", "environment", "flag"])
def test_a_bad_list_item_names_its_key(tmp_path: Path, source: str) -> None:
    """The key comes from the option being checked, not from msgspec's message."""
    file = tmp_path / "c.toml"
    file.write_text('allow_uid = [1, "x"]\n' if source == "file" else "")
    environ = {"TTYSERVE_ALLOW_UID": "1,x"} if source == "environment" else {}
    flags = ["--allow-uid", "1", "--allow-uid", "x"] if source == "flag" else []
    with pytest.raises(ConfigError) as caught:
        config.load(parse("--config", str(file), "--linger", "1", *flags),
                    {"TTYSERVE_MAX_SESSIONS": "8", **environ})
    name = {"file": "allow_uid", "environment": "TTYSERVE_ALLOW_UID", "flag": "--allow-uid"}
    said = {"file": f"config file {file}"}.get(source, source)  # a file's error names it
    assert str(caught.value).startswith(f"{said}: {name[source]}: ")
    assert (type(caught.value) is UsageError) == (source == "flag")


def test_each_source_is_checked_with_its_own_rules(tmp_path: Path) -> None:
    """Text from the environment and flags is converted; a file's values must be typed."""
    file = tmp_path / "c.toml"
    file.write_text('max_sessions = "8"\n')
    with pytest.raises(ConfigError, match=rf"^config file {file}: max_sessions: "):
        config.load(parse("--config", str(file)), {})
    loaded = config.load(parse("--max-frame", "65536"),
                         {"TTYSERVE_MAX_SESSIONS": "8", "TTYSERVE_LINGER": "0.5"})
    assert (loaded.max_frame, loaded.max_sessions, loaded.linger) == (65536, 8, 0.5)


def test_insecure_allows_plain_tcp_and_says_so(short_dir: Path) -> None:
    server = start_server(short_dir, "--insecure", listen=["tcp:127.0.0.1:0"])
    try:
        assert "without a token" in server.stderr_tail()
    finally:
        assert server.stop() == ServeExit.OK


def test_a_config_file_can_carry_every_key(short_dir: Path) -> None:
    token = short_dir / "token"
    token.write_text("t")
    token.chmod(0o600)
    file = short_dir / "c.toml"
    file.write_text(f"""
listen = ["unix:{short_dir / 's.sock'}"]
token_file = "{token}"
insecure = false
allow_uid = [65534]
command = "/bin/sh -l"
allow_command = ["/bin/*"]
allow_env = ["LANG"]
max_connections = 10
max_sessions = 10
max_sessions_per_connection = 2
handshake_timeout = 5.0
max_frame = 65536
max_argv_bytes = 4096
max_env_bytes = 4096
max_cwd_bytes = 256
linger = 0.5
shutdown_timeout = 5.0
journal = "{short_dir / 'journal.jsonl'}"
""")
    server = start_server(short_dir, "--config", str(file), listen=[], expect_lines=1)
    try:
        assert server.addresses == [f"unix:{short_dir / 's.sock'}"]
    finally:
        assert server.stop() == ServeExit.OK
