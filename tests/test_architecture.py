"""The package map docs/architecture.md draws, checked on the code itself: who may import
whom, where llama.cpp and Lua may appear, and how big a room or a module may grow."""

from __future__ import annotations

import ast
import re
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


def circle(graph: dict[str, set[str]]) -> str | None:
    """An import circle of `graph` (name -> names it imports), as "a -> b -> a"; None if none."""
    done: set[str] = set()

    def visit(name: str, stack: list[str]) -> str | None:
        if name in stack:
            return " -> ".join([*stack[stack.index(name) :], name])
        if name in done:
            return None
        for imported in sorted(graph.get(name, ())):
            own = imported == name or name.startswith(imported + ".")  # a package's own __init__
            if not own and (found := visit(imported, [*stack, name])):
                return found
        done.add(name)
        return None

    return next((found for name in sorted(graph) if (found := visit(name, []))), None)


def test_no_import_circle():
    graph = {
        name: {m for m in imports(path, everything=False) if m in MODULES} for name, path in MODULES.items()
    }
    assert circle(graph) is None, circle(graph)


def api_rooms(modules: dict[str, Path] = MODULES) -> dict[str, set[str]]:
    """api/'s packages (api.jobs) and top-level modules (api.services), each with those it
    imports (anywhere in it, a function's imports too)."""

    def room(name: str) -> str:
        return ".".join(name.split(".")[:2])

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        if _top(name) != "api" or name == "api":
            continue
        wanted = {room(m) for m in imports(path) if _top(m) == "api" and m != "api"}
        graph.setdefault(room(name), set()).update(wanted - {room(name)})
    return graph


def test_no_two_rooms_of_api_import_each_other_nor_run_in_a_circle():
    """One way down through api/: endpoints/ over streaming/ and jobs/, cluster/ over jobs/,
    services.py composing them, ops/ over all (docs/architecture.md)."""
    graph = api_rooms()
    assert {"api.endpoints", "api.jobs", "api.services"} <= set(graph)
    assert circle(graph) is None, circle(graph)


def test_a_planted_import_between_two_rooms_is_a_circle():
    graph = api_rooms()
    graph["api.jobs"] = graph["api.jobs"] | {"api.cluster"}  # cluster/ imports jobs/ (the reaper)
    assert circle(graph) is not None


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


def test_the_benchmarks_import_nothing_of_the_tests():
    """bench/ and tests/ share their helpers through devstack/ (devstack/sse_contract.py), so
    neither depends on the other's files."""
    wrong = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "bench").rglob("*.py")
        if any(_top(name) == "tests" for name in imports(p))
    }
    assert not wrong


def test_the_benchmarks_top_level_stays_small():
    """bench/ holds at most MAX_MODULES files at its top; the rest is grouped in folders
    (bench/faults/, bench/endpoints/, bench/lib/, bench/probes/)."""
    files = [p.name for p in (ROOT / "bench").iterdir() if p.is_file()]
    assert len(files) <= MAX_MODULES, sorted(files)


# The modules with no tests/unit/ mirror: each needs real processes or the real model, and
# the integration tests named beside it cover it. At most MAX_UNMIRRORED; a new module comes
# with its mirror.
UNMIRRORED = {
    "api/endpoints/routes.py": "test_openai_sdk.py",
    "api/files/store.py": "test_batches.py",
    "api/metrics.py": "test_prometheus.py",
    "api/ops/health.py": "test_failures.py",
    "api/ops/internal.py": "test_prometheus.py",
    "api/ops/prometheus.py": "test_prometheus.py",
    "api/streaming/reader.py": "test_stream_reader.py",
    "worker/attempts/durability.py": "test_failover.py",
    "worker/attempts/embedding.py": "test_embeddings.py",
    "worker/attempts/rules.py": "test_recovery.py",
    "worker/engine/batching.py": "test_batching.py",
    "worker/engine/embedding/engine.py": "test_embeddings.py",
    "worker/engine/model.py": "test_batching.py",
    "worker/redis/link.py": "test_publishing.py",
}
MAX_UNMIRRORED = 15


def _mirror(path: Path) -> Path:
    return ROOT / "tests" / "unit" / path.relative_to(ROOT).parent / f"test_{path.stem}.py"


def test_every_module_has_its_unit_test_module_or_its_named_integration_tests():
    modules = [p for p in MODULES.values() if p.name not in ("__init__.py", "__main__.py")]
    unmirrored = {str(p.relative_to(ROOT)) for p in modules if not _mirror(p).exists()}
    listed = set(UNMIRRORED)
    assert unmirrored <= listed, f"give these a tests/unit/ mirror: {sorted(unmirrored - listed)}"
    assert unmirrored >= listed, f"mirrored now, off UNMIRRORED: {sorted(listed - unmirrored)}"
    assert len(listed) <= MAX_UNMIRRORED
    covering = ROOT / "tests" / "integration"
    assert all((covering / test).is_file() for test in UNMIRRORED.values())


def test_the_results_cite_only_files_inside_the_project():
    """A benchmark's raw files live in bench/results/gpu-runs/, not beside the checkout where
    a new clone lacks them (the H100 run's were lost so)."""
    cited = []
    for doc in [*(ROOT / "docs").glob("*.md"), *(ROOT / "bench" / "results").glob("*.md")]:
        text = doc.read_text()
        assert "../shared" not in text, doc
        cited += re.findall(r"`(bench/results/gpu-runs/[^`]+)`", text)
    assert cited and all((ROOT / path).exists() for path in cited), cited
