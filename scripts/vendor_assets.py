"""Fetch the browser terminal's vendored assets from the npm registry, checking their integrity.

    python scripts/vendor_assets.py            # fetch the pinned versions into the package
    python scripts/vendor_assets.py --latest   # show the newest versions and their pins

The assets (xterm.js and its fit addon, with their licenses) are committed under
ttyserve/web/static/vendor/, so `make serve` needs neither node nor the network.
To renew them: run --latest, put the versions and integrity strings it prints in
PACKAGES, run the script, and put the new file hashes it prints in FILES
(tests/unit/test_web_assets.py checks the committed files against FILES).
Standard library only.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import sys
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REGISTRY = "https://registry.npmjs.org"
VENDOR = Path(__file__).resolve().parents[1] / "ttyserve" / "web" / "static" / "vendor"


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    integrity: str  # the registry's sha512 of the tarball (subresource-integrity form)
    files: dict[str, str]  # path in the tarball -> name under static/vendor/


PACKAGES = (
    Package("@xterm/xterm", "6.0.0",
            "sha512-TQwDdQGtwwDt+2cgKDLn0IRaSxYu1tSUjgKarSDkUM0ZNiSRXFpjxEsvc/Zgc5kq5omJ+V0a8/"
            "kIM2WD3sMOYg==",
            {"package/lib/xterm.mjs": "xterm.mjs", "package/css/xterm.css": "xterm.css",
             "package/LICENSE": "LICENSE-xterm.txt"}),
    Package("@xterm/addon-fit", "0.11.0",
            "sha512-jYcgT6xtVYhnhgxh3QgYDnnNMYTcf8ElbxxFzX0IZo+vabQqSPAjC3c1wJrKB5E19VwQei89QCiZZP"
            "86DCPF7g==",
            {"package/lib/addon-fit.mjs": "addon-fit.mjs",
             "package/LICENSE": "LICENSE-addon-fit.txt"}),
)

# sha256 of every vendored file as committed: what the package ships is what was fetched.
FILES = {
    "xterm.mjs": "b336ec65a086c056d4804b3d4c2347da5663d3f23c3f25be866467bd8857ad59",
    "xterm.css": "854a7c0fb70e8b1a083c16797ab827299fb18744f5ad34f227b48337e33293c6",
    "LICENSE-xterm.txt": "b569f629d00f2626a8100df2a1798210535621e42164dfd426a6fe5aac7b0ccd",
    "addon-fit.mjs": "2d87e1bddc73be9111de8beee5370c3bb7aac9c94e18e6f245f02ca741ef1769",
    "LICENSE-addon-fit.txt": "e256f01188af527e4d06d21d06fbf785ae9c50d4b328bf03cbe0ba7f0aa4228f",
}


def integrity_of(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:
        data: bytes = response.read()
    return data


def tarball_url(package: Package) -> str:
    short = package.name.rsplit("/", 1)[-1]
    return f"{REGISTRY}/{package.name}/-/{short}-{package.version}.tgz"


def vendor(package: Package) -> None:
    data = fetch(tarball_url(package))
    if integrity_of(data) != package.integrity:
        sys.exit(f"{package.name}@{package.version}: the tarball's integrity does not match "
                 "the pin; nothing was written")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        for member, name in package.files.items():
            extracted = archive.extractfile(member)
            if extracted is None:
                sys.exit(f"{package.name}: {member} is not a file in the tarball")
            content = extracted.read()
            (VENDOR / name).write_bytes(content)
            print(f'    "{name}": "{hashlib.sha256(content).hexdigest()}",')


def latest() -> None:
    for package in PACKAGES:
        meta = json.loads(fetch(f"{REGISTRY}/{package.name.replace('/', '%2F')}"))
        version = meta["dist-tags"]["latest"]
        print(f"{package.name} {version} {meta['versions'][version]['dist']['integrity']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latest", action="store_true", help="show the newest versions")
    if parser.parse_args().latest:
        latest()
        return
    VENDOR.mkdir(parents=True, exist_ok=True)
    print("FILES = {")
    for package in PACKAGES:
        vendor(package)
    print("}")


if __name__ == "__main__":
    main()
