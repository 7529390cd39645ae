"""The server's sessions: admission, attach and steal, their ends, grants, upgrades."""
