"""The origin check of web listeners (the cross-site WebSocket hijacking defence, protocol
section 8) and the Host check that stops DNS rebinding of loopback listeners."""

from __future__ import annotations

import ipaddress

_DEFAULT_PORTS = {"http": ":80", "https": ":443"}


def normal_origin(origin: str) -> str:
    """An origin as browsers compare them: lowercase, no trailing slash, no default port."""
    origin = origin.strip().lower().rstrip("/")
    default = _DEFAULT_PORTS.get(origin.split("://", 1)[0])
    return origin.removesuffix(default) if default else origin


def origin_allowed(origin: str, own: str, allowed: frozenset[str]) -> bool:
    """Whether a page from ``origin`` may open the WebSocket (the cross-site WebSocket
    hijacking defence): it must be the server's ``own`` origin or one that is ``allowed``
    (both normalised as by `normal_origin`)."""
    offered = normal_origin(origin)
    return offered == normal_origin(own) or offered in allowed


def loopback_name(host: str) -> bool:
    """Whether a Host header (name and port) names this machine: a page whose Host is
    another name reached a loopback listener through DNS rebinding."""
    name = host[1:].split("]", 1)[0] if host.startswith("[") else host.split(":", 1)[0]
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
