"""One live server per socket path and per journal: advisory locks held while serving.

POSIX record locks (fcntl) are used because F_GETLK names the holder's pid,
which the refusal reports. They are per process and are released when any
descriptor of the file is closed, so each locked file is opened once here and
all its I/O goes through that descriptor.
"""

from __future__ import annotations

import fcntl
import os
import struct

from ..errors import LeaseError

_FLOCK = struct.Struct("hhxxxxqqixxxx")  # struct flock on Linux x86-64 and aarch64


def holder_pid(fd: int) -> int | None:
    """The pid holding a write lock on ``fd``'s file, or None if it is free."""
    query = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
    result = fcntl.fcntl(fd, fcntl.F_GETLK, query)
    kind, _whence, _start, _length, pid = _FLOCK.unpack(result)
    return None if kind == fcntl.F_UNLCK else pid


def acquire(fd: int, what: str) -> None:
    """Lock the whole file behind ``fd`` or raise LeaseError naming the holder."""
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise LeaseError(what, holder_pid(fd)) from None


class SocketLease:
    """The lock file `PATH.lock` beside a Unix socket, holding the server's pid."""

    def __init__(self, socket_path: str) -> None:
        self.path = socket_path + ".lock"
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            acquire(self.fd, f"unix:{socket_path}")
            os.ftruncate(self.fd, 0)
            os.write(self.fd, f"{os.getpid()}\n".encode())
        except BaseException:
            os.close(self.fd)
            raise

    @classmethod
    def adopted(cls, socket_path: str, fd: int) -> SocketLease:
        """The lease code before an upgrade in place held (the lock is this process's)."""
        lease = cls.__new__(cls)
        lease.path, lease.fd = socket_path + ".lock", fd
        os.set_inheritable(fd, False)
        return lease

    def release(self) -> None:
        """Remove the lock file, then let go of the lock."""
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(self.fd)
