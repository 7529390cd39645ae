"""The sans-I/O core of protocol v1: frames, control messages, connection state.

Nothing in this package performs I/O, imports anyio, or knows about processes:
bytes go in, events and bytes to send come out.
"""
