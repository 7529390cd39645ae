"""The frontend module as an npm package (js/, issue 41): its TypeScript types checked by tsc
and its own tests under Node's test runner (against a real server; and the echo predictor,
/static/predict.js, against a headless xterm.js), `npm pack` holding the
very file the server serves as /static/ttyserve.js, and the tarball installed into a scratch
project that imports it, in JavaScript and in type-checked TypeScript."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from helpers import start_server, token_file

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "js"
STATIC = ROOT / "ttyserve" / "web" / "static" / "ttyserve.js"
PREDICT = STATIC.with_name("predict.js")
pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("workers")]


def npm() -> str:
    path = shutil.which("npm")
    if path is None or shutil.which("node") is None:
        pytest.skip("npm is not installed (apt-get install nodejs npm)")
    return path


def run(argv: list[str], cwd: Path, **options: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=240,
                          **options)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{argv}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done  # type: ignore[no-any-return]


def test_the_package_tests_packs_and_installs(short_dir: Path, tmp_path: Path) -> None:
    tool = npm()
    run([tool, "ci", "--no-audit", "--no-fund"], PACKAGE)
    server = start_server(short_dir, "--token-file", str(token_file(short_dir, "js-token")),
                          listen=["ws:127.0.0.1:0"])
    try:
        ws = "ws://" + server.addresses[0].removeprefix("ws:") + "/ws"
        tested = run([tool, "test"], PACKAGE, env={
            **os.environ, "TTYSERVE_TEST_SERVER": ws, "TTYSERVE_TEST_TOKEN": "js-token"})
        # Nothing skipped: the session tests had their server, and the predictor's tests
        # (test/predict.test.mjs) their headless xterm.js, which `npm ci` installs.
        assert "# fail 0" in tested.stdout and "# skipped 0" in tested.stdout, tested.stdout
        assert "# pass 0" not in tested.stdout, tested.stdout
    finally:
        server.stop()

    run([tool, "pack", "--pack-destination", str(tmp_path)], PACKAGE)
    version = json.loads((PACKAGE / "package.json").read_text())["version"]
    tarball = tmp_path / f"ttyserve-{version}.tgz"
    with tarfile.open(tarball) as packed:
        names = set(packed.getnames())
        shipped = packed.extractfile("package/ttyserve.js")
        assert shipped is not None and shipped.read() == STATIC.read_bytes()
        predictor = packed.extractfile("package/predict.js")
        assert predictor is not None and predictor.read() == PREDICT.read_bytes()
    assert {"package/ttyserve.d.ts", "package/predict.d.ts", "package/package.json"} <= names

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "package.json").write_text('{"name": "scratch", "type": "module"}')
    run([tool, "install", "--no-audit", "--no-fund", str(tarball)], scratch)
    imported = run(["node", "-e", "import('ttyserve').then((m) => console.log("
                    "typeof m.Connection, typeof m.encodeFrame, m.SUBPROTOCOL))"], scratch)
    assert imported.stdout.split() == ["function", "function", "ttyserve.v1"]
    predicting = run(["node", "-e", "import('ttyserve/predict').then((m) => console.log("
                      "typeof m.Predictor, typeof m.decorations))"], scratch)
    assert predicting.stdout.split() == ["function", "function"]
    (scratch / "use.ts").write_text(
        'import { Connection, type Exit } from "ttyserve";\n'
        'const session = new Connection("ws://h/ws", { token: "t" }).open({ pty: false });\n'
        'session.addEventListener("exit", (e) => { const exit: Exit = e.detail; '
        'const code: number = exit.code; void code; });\n')
    (scratch / "tsconfig.json").write_text(json.dumps({"compilerOptions": {
        "strict": True, "noEmit": True, "module": "NodeNext", "moduleResolution": "NodeNext",
        "target": "ES2022", "lib": ["ES2022", "DOM"], "types": []}, "files": ["use.ts"]}))
    run([str(PACKAGE / "node_modules" / ".bin" / "tsc"), "-p", "."], scratch)
