"""The package map docs/architecture.md draws, checked on the code itself: who may import
whom, where llama.cpp and Lua may appear, and how big a room or a module may grow."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ("contract", "api", "worker")
MAX_MODULES = 15  # per folder, __init__.py included
MAX_LINES = 400


def modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the core."""
    out = {}
    for package in CORE:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = modules()


def imports(path: Path, everything: bool = True) -> set[str]:
    """The modules `path` imports: `from a.b import c` counts as a.b.c when that is a module.
    Without `everything`, only those imported when the module is (not inside a function)."""
    tree = ast.parse(path.read_text())
    nodes = ast.walk(tree) if everything else tree.body
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES)
    return out


def _top(name: str) -> str:
    return name.split(".")[0]


@pytest.mark.parametrize(
    ("package", "never"),
    [("contract", {"api", "worker", "devstack"}), ("api", {"worker", "llama_cpp"}), ("worker", {"api"})],
)
def test_the_layers_import_only_downwards(package, never):
    wrong = {
        (name, imported)
        for name, path in MODULES.items()
        if _top(name) == package
        for imported in imports(path)
        if _top(imported) in never
    }
    assert not wrong


@pytest.mark.parametrize("room", ["api.http", "worker.text", "worker.redis"])
def test_the_lowest_rooms_import_nothing_else_of_their_side(room):
    side = room.split(".")[0]
    outside = {
        (name, imported)
        for name, path in MODULES.items()
        if name.startswith(room + ".")
        for imported in imports(path)
        if _top(imported) == side and not imported.startswith(room)
    }
    assert not outside


def test_only_the_engine_imports_llama_cpp():
    importers = {name for name, path in MODULES.items() if "llama_cpp" in {_top(m) for m in imports(path)}}
    assert importers and all(name.startswith("worker.engine.") for name in importers), importers


def test_every_lua_script_lives_in_contract_lua():
    scripts = {name for name, path in MODULES.items() if "redis.call(" in path.read_text()}
    assert scripts and all(name.startswith("contract.lua.") for name in scripts), scripts


def test_no_import_circle():
    graph = {
        name: {m for m in imports(path, everything=False) if m in MODULES} for name, path in MODULES.items()
    }
    done: set[str] = set()

    def visit(name: str, stack: list[str]) -> None:
        if name in stack:
            raise AssertionError(" -> ".join([*stack[stack.index(name) :], name]))
        if name in done:
            return
        for imported in graph[name]:
            if imported != name and not name.startswith(imported + "."):  # a package's own __init__
                visit(imported, [*stack, name])
        done.add(name)

    for name in graph:
        visit(name, [])


def test_rooms_stay_small():
    folders = {path.parent for path in MODULES.values()}
    crowded = {str(f.relative_to(ROOT)): n for f in folders if (n := len(list(f.glob("*.py")))) > MAX_MODULES}
    assert not crowded
    long = {
        name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long


def test_every_package_says_what_lives_there():
    silent = [
        name
        for name, path in MODULES.items()
        if path.name == "__init__.py" and not ast.get_docstring(ast.parse(path.read_text()))
    ]
    assert not silent


def test_unit_tests_mirror_the_packages():
    """Each folder of tests/unit/ is a package of the core (tests/unit/api/http/ for api/http/)."""
    unit = ROOT / "tests" / "unit"
    folders = {p.parent.relative_to(unit) for p in unit.rglob("test_*.py")} - {Path(".")}
    assert folders and all((ROOT / f).is_dir() for f in folders), folders
