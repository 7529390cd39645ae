"""What `serve` writes on stderr: lines for people (`ttyserve: ...`), or with
`--log-format json` one JSON object a line for a log system (contracts.md, "Running under a
service manager"): `time` (RFC 3339, UTC), `level`, `message` and, where they apply,
`worker` and `session` (a log call's `extra={"session": ID}`)."""

from __future__ import annotations

import datetime
import json
import logging
import sys


class JsonLines(logging.Formatter):
    """One record as one JSON object."""

    def __init__(self, worker: int | None) -> None:
        super().__init__()
        self.worker = worker

    def format(self, record: logging.LogRecord) -> str:
        at = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        line: dict[str, object] = {
            "time": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(), "message": record.getMessage()}
        if self.worker is not None:
            line["worker"] = self.worker
        if (session := getattr(record, "session", None)) is not None:
            line["session"] = session
        if record.exc_info:
            line["message"] = f"{line['message']}\n{self.formatException(record.exc_info)}"
        return json.dumps(line, ensure_ascii=False)


def configure(level: int, log_format: str, worker: int | None = None) -> None:
    """Every log line of this process to stderr, at ``level`` and in ``log_format``; a
    worker's say which it is."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonLines(worker))
    else:
        name = "ttyserve" if worker is None else f"ttyserve[worker {worker}]"
        handler.setFormatter(logging.Formatter(f"{name}: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
