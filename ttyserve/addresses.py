"""Addresses: `unix:PATH`; `tcp:`, `tls:`, `ws:`, `wss:` HOST:PORT; and the carriers a client
reaches a far side through, `ssh://[USER@]HOST[:PORT]` and `via:CMD ...` (contracts.md)."""

from __future__ import annotations

import os
import shlex

import msgspec

from .errors import AddressError
from .runtime import default_socket_path

NETWORK_SCHEMES = ("tcp", "tls", "ws", "wss")  # HOST:PORT; "unix" takes a PATH
CARRIER_SCHEMES = ("ssh", "via")  # a client runs a carrier; a server never listens on these


class Address(msgspec.Struct, frozen=True):
    scheme: str  # "unix", one of NETWORK_SCHEMES, or one of CARRIER_SCHEMES
    path: str = ""
    host: str = ""
    port: int = 0  # ssh: 0 when none was given (ssh's own default applies)
    user: str = ""  # ssh only
    command: tuple[str, ...] = ()  # via only: the carrier and its arguments

    def __str__(self) -> str:
        if self.scheme == "unix":
            return f"unix:{self.path}"
        if self.scheme == "via":
            return f"via:{shlex.join(self.command)}"
        if self.scheme == "ssh":
            user = f"{self.user}@" if self.user else ""
            host = f"[{self.host}]" if ":" in self.host else self.host
            return f"ssh://{user}{host}{f':{self.port}' if self.port else ''}"
        return f"{self.scheme}:{self.netloc}"

    @property
    def carried(self) -> bool:
        """Reached through a carrier process (`ssh://`, `via:`) rather than a socket."""
        return self.scheme in CARRIER_SCHEMES

    @property
    def netloc(self) -> str:
        """HOST:PORT, an IPv6 host in brackets (as in a URL)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def encrypted(self) -> bool:
        """TLS underneath: `tls:` and `wss:`."""
        return self.scheme in ("tls", "wss")

    @property
    def web(self) -> bool:
        """The WebSocket carriage (protocol section 8): `ws:` and `wss:`."""
        return self.scheme in ("ws", "wss")


def default_address() -> Address:
    return Address("unix", path=default_socket_path())


EXPECTED = ("unix:PATH, tcp:HOST:PORT, tls:HOST:PORT, ws:HOST:PORT, wss:HOST:PORT, "
            "ssh://[USER@]HOST[:PORT] or via:CMD ...")


def parse_address(text: str) -> Address:
    """Parse `unix:PATH`, SCHEME:HOST:PORT for a network scheme (IPv6 hosts in brackets),
    `ssh://[USER@]HOST[:PORT]` or `via:CMD ...` (split as a shell splits words)."""
    scheme, sep, rest = text.partition(":")
    if not sep or not rest:
        raise AddressError(f"address {text!r}: expected {EXPECTED}")
    if scheme == "unix":
        return Address("unix", path=os.path.abspath(rest))
    if scheme == "ssh":
        return _parse_ssh(text, rest)
    if scheme == "via":
        try:
            command = tuple(shlex.split(rest))
        except ValueError as exc:
            raise AddressError(f"address {text!r}: {exc}") from None
        if not command:
            raise AddressError(f"address {text!r}: expected via:CMD ... (the carrier command)")
        return Address("via", command=command)
    if scheme not in NETWORK_SCHEMES:
        raise AddressError(f"address {text!r}: unknown scheme {scheme!r}; expected {EXPECTED}")
    host, sep, port_text = rest.rpartition(":")
    if not sep or not host:
        raise AddressError(f"address {text!r}: expected {scheme}:HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return Address(scheme, host=host, port=_port(text, port_text))


def _port(text: str, port_text: str) -> int:
    try:
        port = int(port_text)
    except ValueError:
        raise AddressError(f"address {text!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise AddressError(f"address {text!r}: port {port} is out of range")
    return port


def _parse_ssh(text: str, rest: str) -> Address:
    """`ssh://[USER@]HOST[:PORT]`, an IPv6 HOST in brackets; nothing may follow."""
    if not rest.startswith("//") or not rest[2:]:
        raise AddressError(f"address {text!r}: expected ssh://[USER@]HOST[:PORT]")
    user, at, hostport = rest[2:].rpartition("@")
    if at and not user:
        raise AddressError(f"address {text!r}: empty user before '@'")
    port = 0
    if hostport.startswith("["):
        host, bracket, tail = hostport[1:].partition("]")
        if not bracket or (tail and not tail.startswith(":")):
            raise AddressError(f"address {text!r}: expected ssh://[USER@][IPV6]:PORT")
        if tail:
            port = _port(text, tail[1:])
    else:
        host, colon, port_text = hostport.partition(":")
        if colon:
            port = _port(text, port_text)
    if not host or any(c in host for c in "/?#@ ") or host.startswith("-"):
        raise AddressError(f"address {text!r}: {host!r} is not a host name")
    if user.startswith("-") or any(c in user for c in "/ "):
        raise AddressError(f"address {text!r}: {user!r} is not a user name")
    return Address("ssh", host=host, port=port, user=user)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
