"""`python -m worker`: llama.cpp loads only when the engine does (worker/__main__.py
`load_engine`), so the worker's rooms import without it, and what libgomp reads once at
load (GOMP_SPINCOUNT, docs/operations.md) is set before it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from worker.engine import sizing

PROBE = """
import sys
import worker.__main__
print("llama_cpp" in sys.modules, "numpy" in sys.modules)
"""

LOAD = """
import worker.__main__ as main
from worker.settings import WorkerSettings
try:
    main.load_engine(WorkerSettings.from_env())  # no such model: it fails once llama.cpp is in
except (Exception, SystemExit):
    pass
"""


def test_the_worker_s_module_loads_no_llama_cpp():
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "False"]


@pytest.mark.parametrize(
    ("declared", "gpu_layers", "seen"),
    [
        (None, "0", str(sizing.CPU_SPINCOUNT)),  # a CPU worker: brief
        ("300000", "0", "300000"),  # an operator's count wins
        ("50", "0", "50"),
        (None, "-1", "300000"),  # layers on a GPU: libgomp's own
    ],
)
def test_libgomp_spins_what_the_worker_says(tmp_path, declared, gpu_layers, seen):
    """libgomp's own report of what it read (OMP_DISPLAY_ENV), as the engine loads."""
    pytest.importorskip("llama_cpp")
    (model := tmp_path / "missing.gguf").write_bytes(b"not a gguf")
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env |= {"MODEL_PATH": str(model), "N_GPU_LAYERS": gpu_layers, "OMP_DISPLAY_ENV": "verbose"}
    if declared is not None:
        env["GOMP_SPINCOUNT"] = declared
    run = subprocess.run([sys.executable, "-c", LOAD], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert f"GOMP_SPINCOUNT = '{seen}'" in run.stderr, run.stderr[-2000:]
