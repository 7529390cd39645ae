"""The terminal's state for the channels that ask (`modes`, protocol section 14): the line
discipline's ECHO and ICANON flags, read from the PTY, and whether the output switched to
the alternate screen, read from the output as it passes; and the verdict a frontend needs
(`echoed`, `application`, `hidden`).

The flags are read after every read of output and before every write of input, and a
change is told before the output read with it. A session nobody asked `modes` of has none
of this: it pays nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ...protocol.messages import APPLICATION, ECHOED, HIDDEN, InputVerdict, Modes
from ...protocol.terminal_modes import SCREEN_MODES, TerminalModes

Flags = tuple[bool, bool]  # (ECHO, ICANON)


class Told(Protocol):
    """A channel of the session (sinks.py, attachment.py): told each change."""

    def modes(self, message: Modes) -> None: ...

FRESH: Flags = (True, True)  # a new terminal's: what a process that cannot be read has


def verdict(echo: bool, canonical: bool) -> InputVerdict:
    """What a frontend may do with a key: the terminal echoes it, the program draws what it
    wants, or it is read unseen (a password)."""
    if echo:
        return ECHOED
    return HIDDEN if canonical else APPLICATION


class TerminalState:
    """One PTY session's state, as last told to the channels that asked."""

    __slots__ = ("_flags", "_own_screen", "_screen", "alt_screen", "canonical", "changes", "echo")

    def __init__(self, flags: Callable[[], Flags | None], screen: TerminalModes | None) -> None:
        """``flags``: reads the PTY's (None once it cannot); ``screen``: the session's own
        mode tracker, if it keeps one (else this keeps its own, fed with `output`)."""
        self._flags = flags
        self._own_screen = screen is None
        self._screen = screen if screen is not None else TerminalModes()
        self.echo, self.canonical = flags() or FRESH
        self.alt_screen = self._on_alt_screen()
        self.changes = 0  # changes of the verdict so far: a recording's runs of hidden input

    def output(self, data: bytes) -> None:
        """The program's next output (fed here only where the session keeps no tracker)."""
        if self._own_screen:
            self._screen.feed(data)

    def changed(self) -> bool:
        """Read the state now; whether it differs from what was last told."""
        echo, canonical = self._flags() or (self.echo, self.canonical)
        alt_screen = self._on_alt_screen()
        if (echo, canonical, alt_screen) == (self.echo, self.canonical, self.alt_screen):
            return False
        if verdict(echo, canonical) != verdict(self.echo, self.canonical):
            self.changes += 1
        self.echo, self.canonical, self.alt_screen = echo, canonical, alt_screen
        return True

    def look(self, offset: int, *channels: Told | None) -> int | None:
        """Read the state now; a change is told to ``channels`` (each tells its client if
        it asked), holding from STDOUT ``offset``. The run of unseen input that what is
        typed now belongs to (for a recording), None when it is seen."""
        if self.changed():
            message = self.message(offset)
            for channel in channels:
                if channel is not None:
                    channel.modes(message)
        return self.changes if self.hidden else None

    @property
    def hidden(self) -> bool:
        """Whether what is typed now is read unseen (a recording must not keep it)."""
        return verdict(self.echo, self.canonical) == HIDDEN

    def message(self, offset: int) -> Modes:
        """The state as the wire says it, holding from STDOUT ``offset`` on."""
        return Modes(echo=self.echo, canonical=self.canonical, alt_screen=self.alt_screen,
                     input=verdict(self.echo, self.canonical), offset=offset)

    def _on_alt_screen(self) -> bool:
        modes = self._screen.modes
        return any(modes[mode] for mode in SCREEN_MODES)
