"""Listen and connect addresses: `unix:PATH`, `tcp:HOST:PORT`, `tls:HOST:PORT`."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import AddressError


@dataclass(frozen=True, slots=True)
class Address:
    scheme: str  # "unix", "tcp" or "tls"
    path: str = ""
    host: str = ""
    port: int = 0

    def __str__(self) -> str:
        if self.scheme == "unix":
            return f"unix:{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}:{host}:{self.port}"


def default_socket_path() -> str:
    """`$XDG_RUNTIME_DIR/ttyserve.sock`, else `/tmp/ttyserve-$UID/ttyserve.sock`."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "ttyserve.sock")
    return f"/tmp/ttyserve-{os.getuid()}/ttyserve.sock"


def default_address() -> Address:
    return Address("unix", path=default_socket_path())


def parse_address(text: str) -> Address:
    """Parse `unix:PATH`, `tcp:HOST:PORT` or `tls:HOST:PORT` (IPv6 hosts in brackets)."""
    scheme, sep, rest = text.partition(":")
    if not sep or not rest:
        raise AddressError(f"address {text!r}: expected unix:PATH, tcp:HOST:PORT or tls:HOST:PORT")
    if scheme == "unix":
        return Address("unix", path=os.path.abspath(rest))
    if scheme not in ("tcp", "tls"):
        raise AddressError(f"address {text!r}: unknown scheme {scheme!r} (unix, tcp or tls)")
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
