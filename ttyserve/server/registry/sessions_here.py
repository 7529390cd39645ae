"""The sessions of this worker (or single process) by id, and the opens under way: what
`--max-sessions` counts, server-wide with workers. The one owner of that count: every
change here is published to the other workers (mesh.py's census), and nowhere else."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..mesh import Census
from ..sessions.session import ServerSession


class SessionsHere(dict[str, ServerSession]):
    """Sessions by id (running, and ended ones kept for an attach), and the opens that await
    their spawn or start record."""

    def __init__(self, census: Census | None) -> None:
        super().__init__()
        self._census = census  # with workers: the counts every worker sees
        self.opening = 0

    @property
    def counted(self) -> int:
        """What counts against --max-sessions here: the sessions and the opens under way."""
        return len(self) + self.opening

    def __setitem__(self, session_id: str, session: ServerSession) -> None:
        super().__setitem__(session_id, session)
        self._publish()

    def __delitem__(self, session_id: str) -> None:
        super().__delitem__(session_id)
        self._publish()

    def clear(self) -> None:
        super().clear()
        self._publish()

    @contextmanager
    def open_under_way(self) -> Iterator[None]:
        """An admitted open counts while it awaits its spawn and its start record."""
        self.opening += 1
        self._publish()
        try:
            yield
        finally:
            self.opening -= 1
            self._publish()

    def over_the_server_limit(self, limit: int) -> bool:
        """With workers, whether one more would pass the server-wide ``limit``: it is counted
        first (so racing workers may both refuse at the limit, never both pass it), and
        uncounted again if it does not fit."""
        census = self._census
        if census is None:
            return False
        census.publish(census.SESSIONS, self.counted + 1)
        over = census.total(census.SESSIONS, self.counted + 1) > limit
        if over:
            self.unreserve()
        return over

    def unreserve(self) -> None:
        """A reserved place that no session took (its open failed before it was added)."""
        self._publish()

    def _publish(self) -> None:
        if self._census is not None:
            self._census.publish(self._census.SESSIONS, self.counted)
