"""`python -m worker`: llama.cpp loads only when the engine does (worker/__main__.py
`load_engine`), so the worker's rooms import without it, and what libgomp reads once at
load (GOMP_SPINCOUNT, docs/operations.md) can still be set before it."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import worker.__main__
print("llama_cpp" in sys.modules, "numpy" in sys.modules)
"""


def test_the_worker_s_module_loads_no_llama_cpp():
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "False"]
