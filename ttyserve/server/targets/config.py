"""The targets file (TOML, contracts.md "One door to many hosts"): the hosts behind the
door, each reached by a carrier address, with labels and the command the far side runs.

Read at start and again at SIGHUP; every failure is a ConfigError naming the file and what
in it is wrong.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import msgspec

from ...addresses import CARRIER_SCHEMES, Address, parse_address
from ...defaults import DEFAULT_REMOTE_COMMAND
from ...errors import AddressError, ConfigError
from ..principals import NAME, read_toml


class _Entry(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    via: str
    labels: dict[str, str] = {}
    remote_command: str = DEFAULT_REMOTE_COMMAND
    persist: bool = True


class _File(msgspec.Struct, forbid_unknown_fields=True):
    targets: dict[str, _Entry] = {}


@dataclass(frozen=True, slots=True)
class Target:
    """One target of the file: where it is and how it is reached."""

    name: str
    address: Address
    labels: dict[str, str] = field(default_factory=dict)
    remote_command: str = DEFAULT_REMOTE_COMMAND
    persist: bool = True  # its sessions outlive a carrier that drops (`serve --persist`)


class TargetsFile:
    """The targets of one reading of the file, by name."""

    def __init__(self, targets: list[Target]) -> None:
        self.by_name = {target.name: target for target in targets}

    def __iter__(self) -> Iterator[Target]:
        return iter(self.by_name.values())

    def __len__(self) -> int:
        return len(self.by_name)

    def get(self, name: str) -> Target | None:
        return self.by_name.get(name)


def load_targets(path: str) -> TargetsFile:
    """Read the targets file at ``path``; ConfigError naming the file and what is wrong."""
    where = f"targets file {path}"
    parsed = read_toml(where, path, _File)
    found = []
    for name, entry in parsed.targets.items():
        if not NAME.fullmatch(name):
            raise ConfigError(f"{where}: target {name!r}: a name is letters, digits, '.', '_' "
                              "and '-', at most 64")
        try:
            address = parse_address(entry.via)
        except AddressError as exc:
            raise ConfigError(f"{where}: target {name!r}: via: {exc}") from None
        if address.scheme not in CARRIER_SCHEMES:
            raise ConfigError(f"{where}: target {name!r}: via {entry.via!r} is not reached "
                              "through a carrier (ssh://HOST or via:COMMAND)")
        for label, value in entry.labels.items():
            if not NAME.fullmatch(label) or not value or "=" in value:
                raise ConfigError(f"{where}: target {name!r}: label {label!r} = {value!r}: "
                                  "a label is a name and a value without '='")
        if not entry.remote_command.strip():
            raise ConfigError(f"{where}: target {name!r}: remote_command is empty")
        found.append(Target(name, address, dict(entry.labels), entry.remote_command,
                            entry.persist))
    return TargetsFile(found)
