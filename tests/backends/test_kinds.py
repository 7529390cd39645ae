"""Choosing a backend: the kinds a server can be asked for, and whether each can serve here."""

from __future__ import annotations

import pytest

from ttyserve.backends.kinds import (
    BACKEND_KINDS,
    make_backend,
    resolve_kind,
    unavailable_reason,
)
from ttyserve.backends.local import LocalBackend
from ttyserve.backends.portable import PortableBackend
from ttyserve.backends.spawn import spawn_supported


def test_auto_is_posix_spawn_where_supported_else_portable() -> None:
    expected = "posix_spawn" if spawn_supported() else "portable"
    assert resolve_kind("auto") == expected
    backend = make_backend("auto", "/tmp")
    assert type(backend) is (LocalBackend if spawn_supported() else PortableBackend)
    assert backend.default_cwd == "/tmp"


def test_each_kind_makes_its_backend() -> None:
    assert type(make_backend("posix_spawn", None)) is LocalBackend
    assert type(make_backend("portable", None)) is PortableBackend


def test_portable_and_auto_can_serve_here() -> None:
    assert unavailable_reason("portable") is None
    assert unavailable_reason("auto") is None
    assert (unavailable_reason("posix_spawn") is None) == spawn_supported()


@pytest.mark.parametrize("call", [make_backend, unavailable_reason, resolve_kind])
def test_an_unknown_kind_is_a_value_error(call: object) -> None:
    assert callable(call)
    with pytest.raises(ValueError, match="fork"):
        call("fork")
    assert "fork" not in BACKEND_KINDS
