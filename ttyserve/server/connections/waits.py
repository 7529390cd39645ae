"""What the handler's parts share: the part of an event that has to wait."""

from collections.abc import Awaitable, Callable

Later = Callable[[], Awaitable[object]]  # the part of an event that has to wait
