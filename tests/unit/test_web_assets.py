"""The vendored browser assets are exactly what scripts/vendor_assets.py fetched and pinned."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

from ttyserve.web.http import load_assets

ROOT = Path(__file__).resolve().parents[2]


def vendor_script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("vendor_assets",
                                                  ROOT / "scripts" / "vendor_assets.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_vendored_file_matches_its_pinned_hash() -> None:
    script = vendor_script()
    vendored = {p.name for p in script.VENDOR.iterdir()}
    assert vendored == set(script.FILES)
    for name, digest in script.FILES.items():
        assert hashlib.sha256((script.VENDOR / name).read_bytes()).hexdigest() == digest, name
    assert {name for package in script.PACKAGES for name in package.files.values()} == vendored


def test_the_page_is_served_with_its_licenses_and_no_source_maps() -> None:
    assets = load_assets()
    assert assets["/"] is assets["/static/index.html"]
    for path in ("/static/vendor/LICENSE-xterm.txt", "/static/vendor/LICENSE-addon-fit.txt"):
        assert b"MIT" in assets[path].body or b"Permission is hereby granted" in assets[path].body
    assert assets["/static/page.js"].content_type.startswith("text/javascript")
    assert not any(path.endswith(".map") for path in assets)


def test_the_wheel_ships_every_asset_as_package_data() -> None:
    import tomllib
    from pathlib import PurePosixPath

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["ttyserve"]
    package = ROOT / "ttyserve"
    files = [PurePosixPath(p.relative_to(package).as_posix())
             for p in (package / "web" / "static").rglob("*") if p.is_file()]
    # setuptools globs do not cross folders: "*" in one pattern is one path segment
    assert files and all(any(f.full_match(pattern) if hasattr(f, "full_match")
                             else (len(f.parts) == len(PurePosixPath(pattern).parts)
                                   and f.match(pattern)) for pattern in patterns)
                         for f in files)
