"""Backends: where session processes run.

base.py the interface (and stream helpers for backends without descriptors);
local.py the handles of children of this server and the posix_spawn fast path
(spawn.py); portable.py ptyprocess and subprocess; watch.py how exits are
noticed; kinds.py which backend serves (`make_backend`); groups.py signals to
process groups; reaper.py orphans.
"""
