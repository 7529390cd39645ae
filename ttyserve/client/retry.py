"""Which failures before `opened` a retry may fix, and how long to wait before it."""

from __future__ import annotations

import errno

from ..errors import CarrierError, ConnectionLost, OutOfResources, RequestError

BACKOFF_BASE = 0.1  # seconds before the first retry; doubles each time, with jitter
BACKOFF_CAP = 5.0
_RETRIABLE_ERRNOS = frozenset({
    errno.ECONNREFUSED, errno.ECONNRESET, errno.ENOENT, errno.ETIMEDOUT, errno.EAGAIN,
    errno.ECONNABORTED, errno.EPIPE,
})
RETRIED = (OSError, RequestError, ConnectionLost, CarrierError)  # what may be retried at all


def retriable(exc: BaseException) -> tuple[bool, float | None]:
    """Whether a failure before `opened` may be retried, and the server's hint in seconds."""
    if isinstance(exc, RequestError):
        hint = exc.retry_after_ms
        return exc.retriable, hint / 1000 if hint is not None else None
    if isinstance(exc, CarrierError):
        return exc.retriable, None
    if isinstance(exc, OutOfResources):
        return True, None  # other targets give theirs back
    if isinstance(exc, OSError):
        return exc.errno in _RETRIABLE_ERRNOS or isinstance(exc, TimeoutError), None
    return isinstance(exc, ConnectionLost), None


def backoff(attempt: int, hint: float | None = None) -> float:
    """Seconds before retry number ``attempt + 1``: the server's hint, else exponential
    backoff with jitter (so many clients refused at once do not come back at once)."""
    if hint is not None:
        return hint
    import random  # here: a start with no retry spares its import

    return float(min(BACKOFF_CAP, BACKOFF_BASE * 2**attempt) * random.uniform(0.5, 1.5))
