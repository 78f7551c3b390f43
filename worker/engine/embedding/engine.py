"""The embedding engine: a model in a llama.cpp embeddings context.

Its one decoding thread embeds the inputs of every job running on the worker together, many
per `llama_decode`. Each job's thread tokenizes its inputs (`input_ids`) and waits in `embed`.
Meanwhile the decoding thread packs waiting inputs into decodes
(worker/engine/embedding/packing.py). A decode holds up to `batch_tokens` tokens and
`max_seqs` sequences, one sequence an input. The keys that sent the inputs take turns in it.
The decoding thread then reads each sequence's pooled vector.

The cache is emptied before every decode, so no input sees another's tokens. An input is at
most `n_ctx` tokens, and `batch_tokens` is never less. So an input is read in one micro-batch:
an encoder's attention needs it whole.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import llama_cpp
import numpy as np
from llama_cpp._internals import LlamaModel

from contract.jobspec import JobSpec
from contract.stats import BatchCounters
from contract.tiers import embedding_pool
from worker.engine import llama_log, sizing
from worker.engine.context import StepBatch
from worker.engine.embedding import vectors
from worker.engine.embedding.packing import Item, Request, Waiting
from worker.errors import InputTooLong, PromptRejected
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)

POOLINGS = {
    "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
    "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
    "last": llama_cpp.LLAMA_POOLING_TYPE_LAST,
    # a reranker's (worker/engine/embedding/rank.py)
    "rank": llama_cpp.LLAMA_POOLING_TYPE_RANK,
}
# sequences per decode (llama.cpp allows up to LLAMA_MAX_SEQ, 256)
MAX_SEQS = 64
# how often a job waiting for its vectors asks whether to go on
WAIT_S = 1.0


class EmbeddingEngine:
    """What the runner needs of an engine, for embed jobs.

    `model_name` is the model's embedding pool (contract.tiers.embedding_pool). The worker
    takes from that pool's queues."""

    placement = None
    held = None
    # no chat template: an input's tokens are bounded by its bytes
    prompt_overhead = None
    # the pool a model's workers of this engine serve
    pool = staticmethod(embedding_pool)

    def __init__(self, settings: WorkerSettings, pooling: str) -> None:
        assert settings.model_path is not None
        self.model_name = self.pool(settings.model_name)
        self.pooling = pooling
        self.truncate = settings.embedding_truncate
        llama_log.install()
        llama_cpp.llama_backend_init()
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = settings.n_gpu_layers
        self._model = LlamaModel(path_model=str(settings.model_path), params=mparams, verbose=False)
        m = self._model.model
        # the longest input
        self.n_ctx = min(settings.n_ctx, llama_cpp.llama_model_n_ctx_train(m))
        # a pooled vector's length
        self.dimensions = self.outputs(m)
        self.batch_tokens = max(settings.embedding_batch_tokens, self.n_ctx)
        self.max_seqs = min(MAX_SEQS, llama_cpp.llama_max_parallel_sequences())
        # jobs at once; their inputs share decodes
        self.slots = settings.slots or sizing.EMBEDDING_SLOTS
        self._n_vocab = self._model.n_vocab()
        threads = sizing.threads(settings.n_threads, settings.n_threads_batch, sizing.usable_cores())
        cparams = llama_cpp.llama_context_default_params()
        cparams.embeddings = True
        cparams.pooling_type = POOLINGS[pooling]
        cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = self.batch_tokens
        cparams.n_seq_max = self.max_seqs
        # a decode's sequences share the cache, each as long as it needs
        cparams.kv_unified = True
        # every decode is a batch
        cparams.n_threads = cparams.n_threads_batch = threads.n_threads_batch
        self._ctx = llama_cpp.llama_init_from_model(m, cparams)
        if not self._ctx:
            raise SystemExit(
                f"llama.cpp could not create an embeddings context of {self.batch_tokens} tokens"
            )
        self._batch = StepBatch(self.batch_tokens)
        self._waiting = Waiting()
        self._counters = BatchCounters()
        self._last_step_s = 0.0
        self._decodes = 0
        self._step_delay_s = settings.step_delay_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._decode_loop, name="embedder", daemon=True)
        self._thread.start()
        log.info(
            "embeddings: %s pooling, %d dimensions, inputs of up to %d tokens, decodes of %d tokens "
            "and %d sequences, %d jobs at once, %d threads",
            pooling,
            self.dimensions,
            self.n_ctx,
            self.batch_tokens,
            self.max_seqs,
            self.slots,
            threads.n_threads_batch,
        )

    def input_ids(self, spec: JobSpec) -> list[list[int]]:
        """Each input's tokens. A string's get the model's special tokens, as llama-server adds
        them. Raises PromptRejected naming the input that cannot be embedded here."""
        if spec.kind != "embed":
            raise PromptRejected(f"{self.model_name} serves embeddings only.", "model")
        if spec.dimensions > self.dimensions:
            raise PromptRejected(
                f"dimensions is {spec.dimensions}; this model's embeddings have {self.dimensions}.",
                "dimensions",
            )
        out: list[list[int]] = []
        for i, x in enumerate(spec.inputs):
            param = f"input[{i}]"
            if isinstance(x, str):
                ids = self._model.tokenize(x.encode(), add_bos=True, special=False)
            else:
                ids = list(x)
                if any(t >= self._n_vocab for t in ids):
                    raise PromptRejected(
                        f"Invalid '{param}': a token id is not in this model's vocabulary.", param
                    )
            if not ids:
                raise PromptRejected(f"Invalid '{param}': the input has no tokens.", param)
            if len(ids) > self.n_ctx:
                if not self.truncate:
                    raise InputTooLong(len(ids), self.n_ctx, param)
                ids = ids[: self.n_ctx]
            out.append(ids)
        return out

    def embed(
        self,
        inputs: list[list[int]],
        dimensions: int = 0,
        progress: Callable[[], None] | None = None,
        batch: bool = False,
        stop: Callable[[], bool] | None = None,
        owner: str = "",
    ) -> bytes | None:
        """The inputs' vectors, packed (`contract.entries.Finished.vectors`).

        It blocks while the decoding thread embeds them beside other jobs' inputs. `progress`
        is called while it waits, after any decode ended. Each call says the decoding thread
        is alive: no native call hangs. A Batch API line's inputs (`batch`) fill what room
        interactive jobs leave in decodes. `stop()` is asked every WAIT_S. Once it says so,
        the request is given up and `embed` returns None. Its inputs still waiting are never
        decoded. `owner` is the key that sent it. It takes turns with other keys in every
        decode (worker/engine/embedding/packing.py)."""
        request = Request(inputs, batch, owner=owner)
        self._waiting.add(request)
        seen = self._decodes
        while not request.done.wait(WAIT_S):
            if stop is not None and stop():
                self._waiting.abandon(request)
                return None
            # decodes end: none hangs
            if progress is not None and self._decodes != seen:
                seen = self._decodes
                progress()
        if request.error is not None:
            raise request.error
        return vectors.pack([self.finish(v, dimensions) for v in request.vectors if v is not None])

    def outputs(self, model: llama_cpp.llama_model_p) -> int:
        """How many floats a sequence's pooled output is."""
        return llama_cpp.llama_model_n_embd_out(model)

    def finish(self, vector: np.ndarray, dimensions: int) -> np.ndarray:
        """A pooled output as its job gets it."""
        return vectors.finish(vector, dimensions)

    def _decode_loop(self) -> None:
        while not self._stop.is_set():
            items = self._waiting.next_decode(self.batch_tokens, self.max_seqs, timeout=0.5)
            if not items:
                continue
            # testing: as on a slower machine (STEP_DELAY_SECONDS)
            if self._step_delay_s:
                time.sleep(self._step_delay_s)
            for group in self._decoded(items):
                for item, vector in group:
                    item.request.fill(item.index, vector)

    def _decoded(self, items: list[Item]) -> Iterator[list[tuple[Item, np.ndarray]]]:
        """The items' vectors, from one decode. If it fails, they come from one decode per item.
        So only a request whose own input fails fails, alone and with its own error."""
        try:
            yield list(zip(items, self._decode([item.tokens for item in items]), strict=True))
            return
        except Exception:
            if len(items) == 1:
                log.exception("embedding decode failed")
                items[0].request.fail(RuntimeError("the input could not be embedded"))
                return
            log.warning("a decode of %d inputs failed: embedding them one by one", len(items), exc_info=True)
        for item in items:
            yield from self._decoded([item])

    def _decode(self, inputs: list[list[int]]) -> list[np.ndarray]:
        """One decode, input i as sequence i. Every row is an output: pooling reads them all."""
        tokens, positions, seqs = [], [], []
        for seq, ids in enumerate(inputs):
            tokens += ids
            positions += range(len(ids))
            seqs += [seq] * len(ids)
        self._batch.fill(tokens, positions, seqs, [True] * len(tokens))
        started = time.perf_counter()
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self._ctx), True)
        rc = llama_cpp.llama_decode(self._ctx, self._batch.native)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        out = []
        for seq in range(len(inputs)):
            ptr = llama_cpp.llama_get_embeddings_seq(self._ctx, seq)
            if not ptr:
                raise RuntimeError("llama.cpp returned no pooled embedding")
            vector = np.ctypeslib.as_array(ptr, shape=(self.dimensions,)).copy()
            if not np.all(np.isfinite(vector)):
                raise FloatingPointError("llama.cpp returned a vector that is not finite")
            out.append(vector)
        took = time.perf_counter() - started
        self._last_step_s = took
        self._decodes += 1
        c = self._counters
        c.steps += 1
        c.sequences += len(inputs)
        c.prefill_tokens += len(tokens)
        c.prompt_tokens += len(tokens)
        c.decode_us += int(took * 1e6)
        return out

    def warm_up(self, budget_s: float = 30.0, until: Callable[[], bool] = lambda: False) -> float:
        """One full decode before the worker announces itself, so the weights' pages are mapped.
        It is skipped when a job is waiting already (`until`)."""
        started = time.monotonic()
        if until():
            return 0.0
        ids = self._model.tokenize(b"warm up", add_bos=True, special=False)
        self._decode([ids] * min(self.max_seqs, self.batch_tokens // max(len(ids), 1)))
        self._counters = BatchCounters()
        return time.monotonic() - started

    def counters(self) -> BatchCounters:
        return self._counters

    def step_ms(self) -> float:
        return self._last_step_s * 1000

    def close(self) -> None:
        self._stop.set()
