from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from http_api import ApiServer, api_server


@pytest.fixture
def api(short_dir: Path, workers: int) -> Iterator[ApiServer]:
    """A server with a `ws:` listener on 127.0.0.1 and a token, for each worker count."""
    served = api_server(short_dir, "--command", "/bin/sh")
    try:
        yield served
    finally:
        served.server.stop()
