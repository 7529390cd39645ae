"""N observers of one session, in a process of their own (the `observers` workload): they
attach, say `ready` on stdout, and read everything until the session's exit, as N people
watching would; or (`stall`) never read at all, as a viewer whose link froze. Run as
`python -m benchmarks.observers ADDRESS SESSION N read|stall [TOKEN]`."""

from __future__ import annotations

import sys

import anyio

from ttyserve.client import connect


async def watch(address: str, session: str, count: int, stall: bool,
                token: str | None) -> None:
    async with connect(address, token=token, multiplex=True, window=1 << 20) as conn:
        observers = [await conn.attach(session, role="observer") for _ in range(count)]
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        if stall:  # no output is taken, so no credit goes back: the server must skip them
            await anyio.sleep_forever()
        async with anyio.create_task_group() as group:
            for observer in observers:
                group.start_soon(observer.wait)


if __name__ == "__main__":
    anyio.run(watch, sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "stall",
              sys.argv[5] if len(sys.argv) > 5 else None)
