"""A command-line asyncssh client for the client-cost workload (the peer of `ttyserve exec`).

    python -m benchmarks.asyncssh_client --port P --key FILE -- head -c 1G /dev/zero

Streams the remote command's stdout and stderr to ours byte for byte and
exits with the remote status.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import shlex
import sys
from typing import Any

import asyncssh

READ_SIZE = 256 * 1024


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


async def _copy(reader: Any, fd: int) -> None:
    while True:
        data = await reader.read(READ_SIZE)
        if not data:
            return
        _write_all(fd, data)


async def run(port: int, key: str, argv: list[str]) -> int:
    async with asyncssh.connect(
        "127.0.0.1", port, username=getpass.getuser(), client_keys=[key], known_hosts=None,
        agent_path=None, config=None, preferred_auth="publickey",
    ) as conn:
        process = await conn.create_process(shlex.join(argv), encoding=None,
                                            stdin=asyncssh.DEVNULL)
        await asyncio.gather(_copy(process.stdout, 1), _copy(process.stderr, 2))
        result = await process.wait()
    if result.exit_signal:
        return 128 + 15
    return result.exit_status if result.exit_status is not None else 255


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    sys.exit(asyncio.run(run(args.port, args.key, argv)))


if __name__ == "__main__":
    main()
