"""Running a script of tests/js (the official JavaScript clients), or a coding agent's CLI
installed there, against a stack: skipped, or failed where CI requires node
(TOKENSPOOL_REQUIRE_NODE=1), when node or the installed package is missing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.system import missing

JS = Path(__file__).resolve().parent / "js"


def _require(path: Path) -> None:
    if not path.exists() or not shutil.which("node"):
        if os.environ.get("TOKENSPOOL_REQUIRE_NODE") == "1":
            pytest.fail("node and tests/js/node_modules are required (scripts/setup installs them)")
        pytest.skip(missing("node or the JavaScript clients (scripts/setup installs them with npm)"))


def agent_cli(name: str) -> str:
    """The path of a coding agent's command (`claude`, `codex`, `opencode`), pinned in
    tests/js/agents/package.json."""
    path = JS / "agents" / "node_modules" / ".bin" / name
    _require(path)
    return str(path)


def run_node(script: str, package: str, *args: str) -> dict:
    """The last line `script` prints, as JSON; `package` is what it imports from node_modules."""
    _require(JS / "node_modules" / package)
    done = subprocess.run(["node", script, *args], cwd=JS, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
