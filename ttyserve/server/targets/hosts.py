"""The targets of one worker: for each, its settings, its carrier connection (started at its
first session, closed `--target-idle` seconds after its last), and what `targets` says of it.

A target is a backend (backends/base.py) like this host's: a session's `open` naming it is
spawned there, and everything else about the session (its journal, scrollback, observers,
grants, recording) is this server's as for any other.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import anyio
import anyio.abc

from ...backends.base import ProcessHandle, ProcessSpec
from ...errors import ErrorCode, RequestError
from ...protocol.messages import CONNECTED, IDLE, UNREACHABLE, TargetInfo, TargetState
from .config import Target, TargetsFile
from .link import TargetLink
from .process import RemoteProcess

log = logging.getLogger("ttyserve")

UNREACHABLE_RETRY_MS = 1000  # the hint of a retriable target_unreachable


class TargetPlace:
    """One target in one worker: its carrier connection and its sessions there."""

    def __init__(self, hosts: TargetHosts, target: Target) -> None:
        self.hosts = hosts
        self.target = target
        self.link: TargetLink | None = None
        self.state: TargetState = IDLE
        self.sessions: set[RemoteProcess] = set()
        self._starting: anyio.Event | None = None
        self._failure: RequestError | None = None  # how the last start failed
        self._idle: anyio.CancelScope | None = None

    @property
    def name(self) -> str:
        return self.target.name

    async def spawn(self, spec: ProcessSpec) -> ProcessHandle:
        """A session's process there (the Backend interface)."""
        process = RemoteProcess(self, spec)
        self.sessions.add(process)
        self._busy()
        try:
            await process.start()
        except BaseException:
            process.abandon()
            raise
        return process

    async def connect(self) -> TargetLink:
        """The carrier connection, started if none is up; RequestError target_unreachable
        (those that waited for a start that failed get its answer, not a start each)."""
        waited = False
        while (starting := self._starting) is not None:
            waited = True
            await starting.wait()
        link = self.link
        if link is not None and not link.over and link.welcomed.is_set():
            return link
        if waited and self._failure is not None:
            raise self._failure
        self._starting = starting = anyio.Event()
        self._failure = None
        link = self.link = TargetLink(self.target, self.hosts.window, self._over)
        try:
            self.hosts.start_soon(link.run, self.hosts.task_group)
            timeout = self.hosts.handshake_timeout
            with anyio.move_on_after(timeout):
                await link.welcomed.wait()
            if not link.welcomed.is_set():
                stderr = f"; its stderr: {link.last_stderr}" if link.last_stderr else ""
                raise self.unreachable(f"no welcome within {timeout:g} s (the handshake "
                                       f"timeout){stderr}", retriable=True)
            if link.failure is not None or link.over:
                failure = link.failure
                raise self.unreachable(
                    failure.message if failure is not None else "its carrier ended",
                    retriable=failure.retriable is not False if failure is not None else True)
            self.state = CONNECTED
            return link
        except BaseException as exc:  # (a cancelled open too: its half-started carrier ends)
            if not link.welcomed_at_start:
                link.close()
                if self.link is link:
                    self.link = None
            if isinstance(exc, RequestError):
                self.state = UNREACHABLE
                self._failure = exc
            raise
        finally:
            self._starting = None
            starting.set()

    def unreachable(self, why: str, retriable: bool = True) -> RequestError:
        return RequestError(ErrorCode.TARGET_UNREACHABLE, f"target {self.name}: {why}",
                            retriable=retriable,
                            retry_after_ms=UNREACHABLE_RETRY_MS if retriable else None)

    def start_soon(self, work: Callable[[], Awaitable[object]]) -> None:
        self.hosts.start_soon(work)

    def session_ended(self, process: RemoteProcess) -> None:
        """A session there is over: the connection closes after the idle time without one."""
        self.sessions.discard(process)
        if not self.sessions and self.link is not None:
            self.hosts.start_soon(self._close_when_idle)

    def _busy(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    async def _close_when_idle(self) -> None:
        self._busy()
        with anyio.CancelScope() as self._idle:
            await anyio.sleep(self.hosts.idle)
            if not self.sessions and (link := self.link) is not None:
                log.info("target %s: closing its connection, idle for %g s", self.name,
                         self.hosts.idle)
                self.link = None
                self.state = IDLE
                link.close()

    def _over(self, link: TargetLink) -> None:
        if self.link is link:
            self.link = None
            if link.welcomed_at_start:
                self.state = IDLE if self.state == CONNECTED else self.state


class TargetHosts:
    """Every target of one worker, by name, as the targets file says."""

    def __init__(self, targets: TargetsFile, window: int, idle: float,
                 handshake_timeout: float) -> None:
        self.window = window
        self.idle = idle
        self.handshake_timeout = handshake_timeout
        self.places: dict[str, TargetPlace] = {}
        self.task_group: anyio.abc.TaskGroup | None = None
        self._closing = False
        self._retired: list[TargetPlace] = []  # changed targets' places, for their sessions
        self.replace(targets)

    def replace(self, targets: TargetsFile) -> None:
        """A new reading of the file (SIGHUP): new targets are added, removed ones refuse
        new sessions, and running sessions keep what they were started with (a changed
        target's old place stays theirs, carrier and all, for their resumes, until they
        end)."""
        self.file = targets
        self._retired = [place for place in self._retired
                         if place.sessions or place.link is not None]
        for target in targets:
            place = self.places.get(target.name)
            if place is None or place.target != target:
                if place is not None:
                    self._retired.append(place)
                self.places[target.name] = TargetPlace(self, target)

    def _all(self) -> list[TargetPlace]:
        return [*self.places.values(), *self._retired]

    def place(self, name: str) -> TargetPlace | None:
        """The target named so, while the file names it."""
        return self.places.get(name) if self.file.get(name) is not None else None

    def listing(self, may_open: Callable[[str, Mapping[str, str]], bool]) -> list[TargetInfo]:
        """`targets`: those ``may_open`` allows, sorted by name."""
        return [TargetInfo(name=target.name, labels=dict(target.labels),
                           state=self.places[target.name].state)
                for target in sorted(self.file, key=lambda target: target.name)
                if may_open(target.name, target.labels)]

    def start_soon(self, work: Callable[..., Awaitable[Any]], *args: object) -> None:
        """Run ``work`` beside the carrier connections (nothing once they are closing)."""
        if self._closing:
            return
        assert self.task_group is not None, "TargetHosts.running() is not entered"
        self.task_group.start_soon(work, *args)  # type: ignore[arg-type]

    async def close_all(self) -> None:
        """Close every carrier connection and wait until each carrier is reaped (an upgrade
        in place: the new code would not know them)."""
        links = [place.link for place in self._all() if place.link is not None]
        for link in links:
            link.close()
        for link in links:
            await link.ended.wait()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[TargetHosts]:
        """Where the carrier connections run; on the way out, each is closed."""
        async with anyio.create_task_group() as group:
            self.task_group = group
            try:
                yield self
            finally:
                self._closing = True
                for place in self._all():
                    if place.link is not None:
                        place.link.close()
                group.cancel_scope.cancel()
        self.task_group = None
