"""What both `serve` and `exec` prove themselves with: the token file and TLS contexts.

One reader and one factory, so the two sides cannot drift apart: a token
file that others may read is refused on both, and both speak TLS 1.2 or later.
Every failure is a ConfigError naming the file.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from .errors import ConfigError

if TYPE_CHECKING:
    import ssl

TOKEN_ENV = "TTYSERVE_TOKEN"
Side = Literal["server", "client"]


def read_token(path: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The token in ``path``, else in TTYSERVE_TOKEN, else None.

    The file must be readable by its owner alone (anyone who reads the token
    can run commands as us), and not empty.
    """
    if path is None:
        environ = os.environ if environ is None else environ
        return environ.get(TOKEN_ENV) or None
    try:
        with open(path, "rb") as file:
            mode = os.fstat(file.fileno()).st_mode
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise ConfigError(f"token file {path}: others may read or change it (mode "
                                  f"{stat.S_IMODE(mode):o}); chmod 600 it")
            token = file.read().decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"token file {path}: {reason}") from exc
    if not token:
        raise ConfigError(f"token file {path} is empty")
    return token


def tls_context(side: Side, *, certfile: str | None = None, keyfile: str | None = None,
                cafile: str | None = None) -> ssl.SSLContext:
    """A context for ``side`` that speaks TLS 1.2 or later.

    server: presents ``certfile`` (the chain, PEM) and ``keyfile``; both are required.
    client: verifies the server's certificate and name against the CAs in
    ``cafile``, or the system's when ``cafile`` is None.
    """
    import ssl  # here: `exec` to a Unix socket spares its import

    try:
        if side == "server":
            if certfile is None or keyfile is None:
                raise ConfigError("a TLS server needs a certificate and a key")
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(certfile, keyfile)
        else:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    except OSError as exc:  # ssl.SSLError included
        files = (f"TLS certificate {certfile} / key {keyfile}" if side == "server"
                 else f"TLS CA file {cafile}")
        raise ConfigError(f"{files}: {exc.strerror or exc}") from exc
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context
