"""
The package's imports run one way: no module of it reaches into the repository (the lab in
``reproduce/`` and the tools in ``tools/`` are not in the wheel), and no two of its modules
import each other, directly or around a circle. Imports inside functions count too: they are
the start-up path's (docs/development.md, "How the package is laid out").
"""

from __future__ import annotations

import ast
from pathlib import Path

from matrix import ON_MAIN_RELEASE_ONLY

pytestmark = ON_MAIN_RELEASE_ONLY

PACKAGE = "airflow_dataset_race_fix"
SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imported_names(path: Path) -> list[str]:
    """Every module name an import statement of ``path`` names, ``from X import Y`` as X.Y and X."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        imported = set()
        for target in _imported_names(path):
            if target in modules:
                imported.add(target)
        # 'from pkg import module' imports the module: the package's __init__ only when a name of it is taken
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module in modules:
                if all(f"{node.module}.{alias.name}" in modules for alias in node.names):
                    imported.discard(node.module)
        imported.discard(name)
        graph[name] = imported
    return graph


def test_the_package_imports_nothing_from_the_repository():
    reaching = {
        name: sorted(t for t in _imported_names(path) if t.split(".")[0] in ("reproduce", "tools", "tests"))
        for name, path in _modules().items()
    }
    assert {name: found for name, found in reaching.items() if found} == {}


def test_no_import_circle_in_the_package():
    graph = _graph()
    circles = []
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                circles.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, [*path, target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert circles == [], "\n".join(" -> ".join(circle) for circle in circles)
