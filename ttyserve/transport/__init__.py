"""Bytes on a wire, for both sides: the streams under the protocol (Unix and TCP sockets, pipes,
TLS), the one writer of a connection, and the event loop's readiness callbacks."""
