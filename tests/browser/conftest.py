"""Browser tests need Debian's chromium; without it they are skipped, loudly (see the root
conftest's summary), never silently."""

from __future__ import annotations

import pytest
from cdp import INSTALL_HINT, find_chromium


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if find_chromium() is not None:
        return
    skip = pytest.mark.skip(reason=f"chromium is not installed: {INSTALL_HINT}")
    for item in items:
        if "tests/browser/" in str(item.fspath):
            item.add_marker(skip)
