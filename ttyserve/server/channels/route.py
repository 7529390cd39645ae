"""A route: what one client channel is attached to, wherever its session lives.

A channel's session may be in this process (`SessionChannel`: a writer's `Attachment`
or an `Observer`) or in another worker (`RemoteChannel`, over a hop), and next on another
host. The connection hands what its client sends on a channel to the channel's route and
never asks which it is; every route sends back through the same `ChannelHost`, so the
connection's handler stays the one driver of its protocol core.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from ...protocol.messages import Message

Later = Callable[[], Awaitable[object]]  # the part of a client's request that has to wait


class Route(Protocol):
    """What a connection asks of the session behind one of its channels."""

    channel: int

    @property
    def ends_on_upgrade(self) -> bool:
        """Whether an upgrade in place ends this channel's session here (not detachable)."""
        ...

    def stdin(self, data: bytes) -> Later | None:
        """The client's input; what to await before reading more, if the session is full."""
        ...

    def credit(self, size: int) -> None:
        """The client granted ``size`` more bytes of output (a `window`)."""
        ...

    def resume(self) -> None:
        """The connection's send queue has room again: what waited for it goes on."""
        ...

    def control(self, message: Message) -> None:
        """`resize`, `signal`, `eof` and the like, for the session."""
        ...

    def detach(self) -> None:
        """The client's `detach`: the session goes on without the channel, which ends with
        `detached` (or is refused, where the session cannot be detached)."""
        ...

    def cancel(self) -> None:
        """The client's `cancel`: the core has ended the channel; the session ends."""
        ...

    def close(self) -> None:
        """The connection ends: a detachable session goes on detached, any other ends."""
        ...
