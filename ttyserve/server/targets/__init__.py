"""Targets (`serve --targets FILE`, protocol section 15): sessions on other hosts, each
reached through its carrier, behind this server's sessions as their process backend.

`config` reads the file; `link` is one multiplexed carrier connection to a target's far
side (`serve --stdio --persist`); `process` is a session's process there, as the session
adapter sees any process; `hosts` keeps each worker's links and answers `targets`.
"""
