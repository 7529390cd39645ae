"""Named principals (`serve --principals FILE`, contracts.md "One door to many hosts"): who
may connect, known by the SHA-256 of a token, and what each may reach: the targets it may
open (names, with globs, or `label=value`) and whether it may run sessions on this host.

The file is TOML, read at start and again at SIGHUP; every failure is a ConfigError naming
the file and what in it is wrong. A token is matched against every principal's hash in
constant time, so how long an answer takes says nothing about the tokens.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from ..errors import ConfigError
from ..protocol.messages import NAME_PATTERN

NAME = re.compile(NAME_PATTERN)  # a principal's, a target's or a label's name
_SHA256 = re.compile(r"[0-9a-f]{64}")
Shape = TypeVar("Shape", bound=msgspec.Struct)


class _Entry(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    token_sha256: str
    targets: list[str] = []
    local: bool = True


class _File(msgspec.Struct, forbid_unknown_fields=True):
    principals: dict[str, _Entry] = {}


@dataclass(frozen=True, slots=True)
class Selector:
    """One entry of a principal's `targets`: a name (a glob), or a label and its value."""

    text: str

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        label, equals, value = self.text.partition("=")
        if equals:
            return labels.get(label) == value
        return fnmatch.fnmatchcase(name, self.text)


def selector(text: str) -> Selector:
    """``text`` as a selector; ValueError saying why it is not one."""
    label, equals, value = text.partition("=")
    if equals:
        if not NAME.fullmatch(label) or not value or "=" in value:
            raise ValueError(f"{text!r} is not label=value")
    elif not text or not re.fullmatch(r"[A-Za-z0-9._*?\[\]!-]+", text):
        raise ValueError(f"{text!r} is not a target name or glob")
    return Selector(text)


@dataclass(frozen=True, slots=True)
class Principal:
    """One principal of the file."""

    name: str
    token_sha256: bytes
    targets: tuple[Selector, ...] = ()
    local: bool = True  # may run sessions on this host

    def may_open(self, target: str, labels: Mapping[str, str]) -> bool:
        """Whether this principal may open sessions on ``target``."""
        return any(each.matches(target, labels) for each in self.targets)


class Principals:
    """The principals of one reading of the file, by name."""

    def __init__(self, principals: list[Principal], source: str = "") -> None:
        self.by_name = {principal.name: principal for principal in principals}
        self.source = source  # the file it was read from

    def __iter__(self) -> Iterator[Principal]:
        return iter(self.by_name.values())

    def __len__(self) -> int:
        return len(self.by_name)

    def get(self, name: str) -> Principal | None:
        return self.by_name.get(name)

    def named_by(self, token: str | None) -> Principal | None:
        """The principal whose token this is, compared with every one in constant time."""
        offered = hashlib.sha256((token or "").encode()).digest()
        found = None
        for principal in self.by_name.values():
            if hmac.compare_digest(offered, principal.token_sha256) and token is not None:
                found = principal
        return found


def read_toml(where: str, path: str, shape: type[Shape]) -> Shape:
    """The TOML file at ``path`` as ``shape`` (unknown keys refused); ConfigError saying
    ``where`` and what is wrong (a table declared twice is TOML's own error)."""
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"{where}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    try:
        return msgspec.convert(data, shape, strict=True)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def load_principals(path: str) -> Principals:
    """Read the principals file at ``path``; ConfigError naming the file and what is wrong."""
    where = f"principals file {path}"
    parsed = read_toml(where, path, _File)
    found: list[Principal] = []
    owners: dict[bytes, str] = {}
    for name, entry in parsed.principals.items():
        if not NAME.fullmatch(name):
            raise ConfigError(f"{where}: principal {name!r}: a name is letters, digits, "
                              "'.', '_' and '-', at most 64")
        digest = entry.token_sha256.strip().lower()
        if not _SHA256.fullmatch(digest):
            raise ConfigError(f"{where}: principal {name!r}: token_sha256 must be the 64 "
                              "hex digits of the token's SHA-256 (sha256sum prints them)")
        token = bytes.fromhex(digest)
        if token in owners:
            raise ConfigError(f"{where}: principals {owners[token]!r} and {name!r} have the "
                              "same token")
        owners[token] = name
        try:
            targets = tuple(selector(text) for text in entry.targets)
        except ValueError as exc:
            raise ConfigError(f"{where}: principal {name!r}: targets: {exc}") from None
        found.append(Principal(name, token, targets, entry.local))
    return Principals(found, path)
