"""The version of ttyserve: one place, read by the package, the build and `welcome`."""

__version__ = "0.1.0"
