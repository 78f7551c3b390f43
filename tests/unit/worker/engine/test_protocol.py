"""worker/engine/protocol.py: the seam every engine meets, with one `Generation` in; and its
plain types: a device's backend from its name, the KV cache's share on the GPU by the layers
offloaded, and the line a worker logs at start, to the digit."""

from __future__ import annotations

import inspect
import itertools

import pytest

from contract.jobspec import JobSpec, Message
from worker.engine.protocol import Device, Engine, Generation, Placement
from worker.engine.synthetic import EOS, ScriptedEngine, SyntheticEngine

GIB = 2**30


@pytest.mark.parametrize(
    ("name", "backend"),
    [("CUDA0", "CUDA"), ("CUDA12", "CUDA"), ("Vulkan1", "Vulkan"), ("CPU", "CPU"), ("0", "0"), ("", "")],
)
def test_a_devices_backend_is_its_name_without_the_index(name, backend):
    assert Device(name, "a device", "gpu", 1, 2).backend == backend


def test_the_kv_cache_on_the_gpu_is_its_share_of_the_layers_offloaded():
    def on_gpu(kv: int, layers: int, gpu_layers: int) -> int:
        return Placement("CUDA", "GPU", (0, 0), layers, gpu_layers, kv, 1, 512).kv_on_gpu

    assert on_gpu(8 * GIB, 32, 32) == 8 * GIB
    assert on_gpu(8 * GIB, 32, 8) == 2 * GIB
    assert on_gpu(10, 3, 1) == 3  # whole bytes, rounded down
    assert on_gpu(8 * GIB, 32, 0) == 0
    assert on_gpu(8 * GIB, 0, 0) == 0  # a model of no repeating layers: no division by zero


def test_a_cpu_worker_says_its_cache_is_in_host_memory():
    cpu = Placement("CPU", "AMD EPYC 9654", (100 * GIB, 128 * GIB), 24, 0, 3 * GIB // 2, 4, 8192)
    assert cpu.describe() == (
        "backend CPU on AMD EPYC 9654 (128.0 GiB, 100.0 GiB free); 0 of 24 layers offloaded; "
        "KV cache 1536 MiB (in host memory); 4 slots x 8192 tokens"
    )


def test_a_partly_offloaded_model_says_how_its_cache_is_split():
    gpu = Placement("CUDA", "NVIDIA L4", (GIB * 41 // 2, 24 * GIB), 32, 24, 4 * GIB, 8, 4096)
    assert gpu.describe() == (
        "backend CUDA on NVIDIA L4 (24.0 GiB, 20.5 GiB free); 24 of 32 layers offloaded; "
        "KV cache 4096 MiB (3.00 GiB on the GPU, 1.00 GiB in host memory); 8 slots x 4096 tokens"
    )


def test_placements_are_values():
    a = Placement("CUDA", "NVIDIA L4", (1, 2), 32, 24, 4 * GIB, 8, 4096)
    assert a == Placement("CUDA", "NVIDIA L4", (1, 2), 32, 24, 4 * GIB, 8, 4096)
    assert a != Placement("CUDA", "NVIDIA L4", (1, 2), 32, 23, 4 * GIB, 8, 4096)
    with pytest.raises(AttributeError):
        a.slots = 4  # type: ignore[misc]


METHODS = sorted(n for n, v in vars(Engine).items() if callable(v) and not n.startswith("_"))


def engines() -> list[type]:
    found = [SyntheticEngine, ScriptedEngine]
    try:
        from worker.engine.model import LlamaEngine
    except ImportError:  # no llama_cpp here
        return found
    return [*found, LlamaEngine]


@pytest.mark.parametrize("engine", engines(), ids=lambda e: e.__name__)
def test_every_engine_meets_the_seam_with_one_generation_in(engine):
    """The attempts call an engine by the protocol alone: every engine has each method, and
    `tokens` takes one `Generation`, nothing else."""
    for name in METHODS:
        assert callable(getattr(engine, name, None)), f"{engine.__name__} lacks {name}"
    assert list(inspect.signature(engine.tokens).parameters) == ["self", "job"]


def test_the_model_free_engines_say_they_hold_no_device_and_no_cache():
    synthetic = SyntheticEngine("synthetic-t", 4096, 3, rate=0)
    for engine in (synthetic, ScriptedEngine([1])):
        assert set(Engine.__annotations__) <= set(dir(engine))
        assert (engine.placement, engine.held, engine.prompt_overhead) == (None, None, None)
        assert engine.warm_up() == 0.0 and engine.step_ms() == 0.0


def test_the_scripted_engine_says_its_script_and_keeps_what_it_was_asked():
    spec = JobSpec(id="chatcmpl-s", kind="chat", model="m", messages=(Message("user", "hi"),))
    told: list[int] = []
    engine = ScriptedEngine([5, 6, EOS], cached_tokens=2, words={5: "a", 6: "b"})
    job = Generation(spec, engine.prompt_ids(spec), [9], since_ms=7, cached=told.append)
    stream = engine.tokens(job)
    assert [(p.token, piece) for p, piece in itertools.islice(stream, 2)] == [(5, b"a"), (6, b"b")]
    stream.close()
    assert told == [2] and engine.asked == [job] and engine.contexts == [[100, 101, 102, 9]]
    assert engine.is_end(EOS) and not engine.is_end(5) and engine.piece(8) == b"<8>"
