"""`python -m worker`: llama.cpp loads only when the engine does, after the worker has set
what libgomp reads once, at load (worker/__main__.py `load_engine`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import os, sys
import worker.__main__ as main
assert "llama_cpp" not in sys.modules, "llama.cpp loaded with worker/__main__.py"
from worker.settings import WorkerSettings
try:
    main.load_engine(WorkerSettings.from_env())  # no such model: it fails once llama.cpp is in
except (Exception, SystemExit):
    pass
print(os.environ.get("GOMP_SPINCOUNT"), "llama_cpp" in sys.modules)
"""


@pytest.mark.parametrize(("given", "passed"), [(None, "10000"), ("300000", "300000")])
def test_the_spin_count_is_set_before_llama_cpp_loads(tmp_path, given, passed):
    pytest.importorskip("llama_cpp")
    (model := tmp_path / "missing.gguf").write_bytes(b"not a gguf")
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"} | {"MODEL_PATH": str(model)}
    if given is not None:
        env["GOMP_SPINCOUNT"] = given
    run = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [passed, "True"]
