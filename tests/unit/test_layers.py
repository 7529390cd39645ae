"""The package's layers (docs/design.md): every import points down, and none goes round.

Read from the source with no import of it: each module's `import` statements, those under
`if TYPE_CHECKING:` left out (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "ttyserve"

# Bottom first; a module may import its own layer and those below it, never one above.
LAYERS = [
    {"version", "errors", "defaults", "runtime", "lines", "addresses", "credentials", "ids",
     "asciicast"},
    {"protocol"},
    {"exitcodes"},
    {"transport"},
    {"backends"},
    {"web"},
    {"server"},
    {"client"},
    {"api"},
    {"cli"},
    {"__init__", "__main__"},
]


# Inside server/, bottom first: what every part uses, one session, what attaches to it, the
# sessions of the server, one connection, and the server itself.
SERVER_LAYERS = [
    {"journal", "lease", "sockets", "tasks", "handover", "grants", "auth", "principals", "policy",
     "settings", "config", "mesh", "activation", "accepting"},
    {"targets"},  # a session's process on another host (a backend of the server's own)
    {"sessions"},
    {"channels"},
    {"registry"},
    {"connections"},
    {"listener", "reloading", "upgrade", "supervisor", "__init__"},
]


def server_layer(module: str) -> int | None:
    """The layer inside server/ of ``module``; None outside server/."""
    parts = module.split(".")
    if parts[:2] != ["ttyserve", "server"]:
        return None
    top = parts[2] if len(parts) > 2 else "__init__"
    return next(i for i, names in enumerate(SERVER_LAYERS) if top in names)


def layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__init__"
    return next(i for i, names in enumerate(LAYERS) if top in names)


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name if name != "ttyserve" else "ttyserve.__init__"] = path
    return found


def imports(module: str, path: Path, top_level_only: bool) -> set[str]:
    """The ttyserve modules ``module`` imports (names resolved, packages as their __init__)."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                if base.startswith("ttyserve") and (top or not top_level_only):
                    found.add(base)
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.startswith("ttyserve") and (top or not top_level_only):
                        found.add(alias.name)
            inner = top and not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            visit(child, inner)

    visit(tree, True)
    return found


def test_every_import_points_down() -> None:
    wrong = [f"{module} imports {target}"
             for module, path in modules().items()
             for target in imports(module, path, top_level_only=False)
             if layer(target) > layer(module)]
    assert wrong == []


def test_no_module_imports_itself_round_a_circle() -> None:
    known = modules()
    graph = {module: {t for t in imports(module, path, top_level_only=True) if t in known}
             for module, path in known.items()}
    done: set[str] = set()

    def circle_from(module: str, trail: list[str]) -> list[str] | None:
        if module in trail:
            return [*trail[trail.index(module):], module]
        if module in done:
            return None
        for target in sorted(graph[module]):
            if (found := circle_from(target, [*trail, module])) is not None:
                return found
        done.add(module)
        return None

    circles = [c for m in sorted(graph) if (c := circle_from(m, [])) is not None]
    assert circles == []


def test_inside_server_every_import_points_down() -> None:
    wrong = []
    for module, path in modules().items():
        here = server_layer(module)
        for target in imports(module, path, top_level_only=False) if here is not None else ():
            if (there := server_layer(target)) is not None and there > here:
                wrong.append(f"{module} imports {target}")
    assert wrong == []


def test_no_module_of_the_server_or_the_client_is_over_500_lines() -> None:
    """Small modules with one job each (issue 27): past 500 lines a module holds several."""
    long = {str(path.relative_to(PACKAGE)): lines
            for path in [*PACKAGE.glob("server/**/*.py"), *PACKAGE.glob("client/**/*.py")]
            if (lines := len(path.read_text().splitlines())) > 500}
    assert long == {}
