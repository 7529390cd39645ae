"""A carrier that dies between a session's `open` and its `opened` (a fault injected through a
real seam): it runs the far side given as its arguments and relays both ways, until the
far side answers the first `open`; then it exits at once, that answer undelivered."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

OPEN = b'"type":"open"'


def main() -> None:
    child = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    opened = threading.Event()

    def to_child() -> None:
        while data := os.read(0, 65536):
            child.stdin.write(data)  # type: ignore[union-attr]
            child.stdin.flush()  # type: ignore[union-attr]
            if OPEN in data:
                opened.set()

    threading.Thread(target=to_child, daemon=True).start()
    while data := os.read(child.stdout.fileno(), 65536):
        if opened.is_set():  # the far side's answer to the open: never delivered
            os._exit(0)
        os.write(1, data)


if __name__ == "__main__":
    main()
