"""worker/engine/devices.py: the devices ggml's registry offers and where a loaded model sits,
read from this build's own libraries (a CPU build here; the GPU build says CUDA)."""

from __future__ import annotations

import pytest

from worker.settings import default_model_path

llama_cpp = pytest.importorskip("llama_cpp")
from llama_cpp._internals import LlamaModel  # noqa: E402

from worker.engine import devices  # noqa: E402

pytestmark = pytest.mark.skipif(default_model_path() is None, reason="no SmolLM2 GGUF: run scripts/setup")

SMOLLM2_LAYERS = 30  # SmolLM2-135M's repeating layers, from its GGUF header


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()  # the whole model (mmapped): its layers are read
    return LlamaModel(path_model=str(default_model_path()), params=params, verbose=False)


def test_the_registry_lists_the_cpu_with_its_memory():
    found = devices.devices()
    cpus = [d for d in found if d.kind == "CPU"]
    assert cpus, found
    cpu = cpus[0]
    assert cpu.backend == "CPU" and cpu.description
    assert 0 < cpu.free <= cpu.total  # ggml reads the host's memory for its CPU device


def test_a_model_on_a_build_without_a_gpu_stays_in_host_memory_whatever_it_asks(model):
    if any(d.kind in ("GPU", "IGPU") for d in devices.devices()):
        pytest.skip("a GPU build: its offload is the GPU run's to check")
    kv = 3 * 2**20
    for asked in (-1, 0, 12):
        where = devices.placement(model.model, asked, kv, slots=4, n_ctx=4096)
        assert (where.backend, where.layers, where.gpu_layers) == ("CPU", SMOLLM2_LAYERS, 0)
        assert where.kv_on_gpu == 0 and (where.kv_bytes, where.slots, where.n_ctx) == (kv, 4, 4096)
        assert where.memory[1] > 0
        assert "0 of 30 layers offloaded" in where.describe()
