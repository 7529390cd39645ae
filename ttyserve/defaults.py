"""Every default of ttyserve's own, in one place: what the server, the client and the
command line fall back to. Plain constants, so that a client imports nothing else."""

from .version import __version__

DEFAULT_LINGER = 2.0  # seconds of output drain after exit (the contract's default grace)
DEFAULT_SHUTDOWN_TIMEOUT = 30.0  # seconds for the drain before the watchdog forces the end
DEFAULT_HANDSHAKE_TIMEOUT = 10.0  # seconds for `hello` (and, single-session, `open`)
DEFAULT_MAX_CONNECTIONS = 256
DEFAULT_MAX_SESSIONS = 1024
DEFAULT_MAX_SESSIONS_PER_CONNECTION = 64
DEFAULT_SCROLLBACK = 1 << 20  # bytes of output a detachable session keeps (section 9)
DEFAULT_DETACHED_TIMEOUT = 24 * 3600.0  # seconds a detached session waits for an attach
DEFAULT_REMOTE_COMMAND = "ttyserve"  # what a carrier runs on the far side, with serve --stdio
DEFAULT_PARALLEL = 32  # targets a fan-out runs on at once
CLIENT_NAME = f"ttyserve-python/{__version__}"  # what our clients call themselves in `hello`
