"""Backends: where session processes run. `base` is the interface, `local` runs them here."""
