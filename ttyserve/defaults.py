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
DEFAULT_KEEP_ENDED = 60.0  # seconds an ended session's exit may be fetched again (section 10)
DEFAULT_MAX_OBSERVERS = 16  # observers one session takes (section 11)
DEFAULT_MAX_SHARE_TTL = 24 * 3600  # seconds the longest grant lasts (section 11)
DEFAULT_SHARE_TTL = 3600  # seconds a grant of `ttyserve share` lasts without --ttl
DEFAULT_HEARTBEAT = 5  # seconds between heartbeats of `exec --resume` (section 10)
MAX_HEARTBEAT = 3600  # the longest heartbeat `hello` may ask for (section 10)
HEARTBEAT_MISSES = 3  # heartbeats of silence after which a connection is dead
TCP_KEEPALIVE_IDLE = 60  # seconds of TCP silence before the kernel's first probe
TCP_KEEPALIVE_INTERVAL = 10  # seconds between probes
TCP_KEEPALIVE_COUNT = 6  # unanswered probes after which the kernel drops the connection
DEFAULT_REMOTE_COMMAND = "ttyserve"  # what a carrier runs on the far side, with serve --stdio
STDIO_ARGUMENTS = ("serve", "--stdio")  # what a carrier runs on the far side, after it
PERSIST_ARGUMENTS = (*STDIO_ARGUMENTS, "--persist")  # the same for sessions that outlive it
DEFAULT_TARGET_IDLE = 60.0  # seconds a target's carrier connection outlives its last session
DEFAULT_TARGET_WINDOW = 1 << 20  # output credit per session on a target, beyond what was taken
DEFAULT_PARALLEL = 32  # targets a fan-out runs on at once
WARM_IDLE = 300.0  # seconds a warm far side (cli/warm.py) waits for a connection before it ends
DEFAULT_STDIN_WINDOW = 1 << 20  # STDIN credit per channel on windowed connections (section 7)
DEFAULT_MAX_ARGV_BYTES = 256 * 1024  # the largest argv an `open` may carry
DEFAULT_MAX_ENV_BYTES = 256 * 1024  # the largest env an `open` may carry
DEFAULT_MAX_CWD_BYTES = 4096  # the longest cwd (PATH_MAX)
CLIENT_NAME = f"ttyserve-python/{__version__}"  # what our clients call themselves in `hello`

# What each read takes, and the bounds of what waits in memory, by what it serves.
OUTPUT_CHUNK = 128 * 1024  # one read of a process's output, and the largest output frame:
# a flood holds a keystroke of another session up by one chunk at most (performance.md)
SERVER_RECEIVE = 64 * 1024  # one read of a client connection: under glibc's 128 KiB mmap
# threshold (a larger buffer, cut to the keystroke it got, was mapped and unmapped each time)
CLIENT_RECEIVE = 1 << 20  # one read of the client library's connection to a server
STDIN_READ = 64 * 1024  # one read of `exec`'s own stdin
HTTP_RECEIVE = 64 * 1024  # one read of a web listener's request (its head is 16 KiB at most)
HTTP_MAX_JSON_BODY = 1 << 20  # the largest JSON body of an API request (section 13): 413 over
HTTP_MAX_WAIT = 300  # seconds, the longest `wait` on a session's status (section 13)
WEBSOCKET_RECEIVE = 256 * 1024  # one read under the WebSocket carriage, both sides
WEBSOCKET_MAX_MESSAGE = 4 << 20  # the largest WebSocket frame taken (read whole): whole
# protocol frames of up to max_frame each, a sender's batch of them (1009 beyond)
DRAIN_RECEIVE = 64 * 1024  # one read of what a peer still sends while a connection closes
CARRIER_STDERR_READ = 64 * 1024  # one read of a carrier's stderr (ssh's diagnostics)
STDIN_LIMIT = 1 << 20  # stdin queued for a process that does not read, without windows
OUTBOX_LIMIT = 1 << 20  # bytes queued for a connection before its producers wait
REDRAW_INTERVAL = 1.0  # seconds: observers attaching make a program redraw once so at most
SOON_BYTES = 64 * 1024  # an observer's output framed and held until the loop's turn ends
TERM_GRACE = 5.0  # seconds `exec` waits for the session to end after forwarding a SIGTERM
KILL_GRACE = 1.0  # seconds between a session's hang-up (SIGHUP) and SIGKILL when it is ended
BUSY_RETRY_MS = 1000  # the hint sent with `busy` and `shutting_down`
UPGRADE_RETRY_MS = 250  # the hint sent with `server_restarting`: the new code starts by then
DEFAULT_UPGRADE_DRAIN = 0.0  # seconds undetachable sessions may end by themselves at an upgrade
GOODBYE_WAIT = 2.0  # seconds a client waits to tell the server it leaves a session (a cancel,
# a detach): a resume under way may never come back
CLOSE_TIMEOUT = 2.0  # seconds a server sends its EOF and drains the client's bytes at the end
