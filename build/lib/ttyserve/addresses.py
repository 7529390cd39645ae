"""Listen and connect addresses: `unix:PATH`, and `tcp:`, `tls:`, `ws:`, `wss:` HOST:PORT."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import AddressError

NETWORK_SCHEMES = ("tcp", "tls", "ws", "wss")  # HOST:PORT; "unix" takes a PATH


@dataclass(frozen=True, slots=True)
class Address:
    scheme: str  # "unix", or one of NETWORK_SCHEMES
    path: str = ""
    host: str = ""
    port: int = 0

    def __str__(self) -> str:
        if self.scheme == "unix":
            return f"unix:{self.path}"
        return f"{self.scheme}:{self.netloc}"

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


def default_socket_path() -> str:
    """`$XDG_RUNTIME_DIR/ttyserve.sock`, else `/tmp/ttyserve-$UID/ttyserve.sock`."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "ttyserve.sock")
    return f"/tmp/ttyserve-{os.getuid()}/ttyserve.sock"


def default_address() -> Address:
    return Address("unix", path=default_socket_path())


EXPECTED = "unix:PATH, tcp:HOST:PORT, tls:HOST:PORT, ws:HOST:PORT or wss:HOST:PORT"


def parse_address(text: str) -> Address:
    """Parse `unix:PATH` or SCHEME:HOST:PORT for a network scheme (IPv6 hosts in brackets)."""
    scheme, sep, rest = text.partition(":")
    if not sep or not rest:
        raise AddressError(f"address {text!r}: expected {EXPECTED}")
    if scheme == "unix":
        return Address("unix", path=os.path.abspath(rest))
    if scheme not in NETWORK_SCHEMES:
        raise AddressError(f"address {text!r}: unknown scheme {scheme!r}; expected {EXPECTED}")
    host, sep, port_text = rest.rpartition(":")
    if not sep or not host:
        raise AddressError(f"address {text!r}: expected {scheme}:HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise AddressError(f"address {text!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise AddressError(f"address {text!r}: port {port} is out of range")
    return Address(scheme, host=host, port=port)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
