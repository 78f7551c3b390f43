"""The model: loaded once per worker process, decoding up to SLOTS jobs at once.

The engine turns a job into prompt token ids (worker.engine.prompts). Then it turns them into a stream
of (token id, bytes) pairs. The batching scheduler makes them with the other jobs'
(worker.engine.batching). The engine knows nothing of Redis or the stream contract.
`worker.attempts.runner` decides when to stop.

The KV cache is allocated at start for SLOTS sequences of N_CTX tokens each. It may not fit, with the
weights, in the memory this process may use. Then it is refused before anything is allocated.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Generator, Sequence

import llama_cpp
from llama_cpp._internals import LlamaModel

from contract.jobspec import JobSpec, Message
from contract.prefixes import PromptOverhead, prefixes
from contract.stats import BatchCounters
from contract.tiers import BATCH
from worker.engine import batching, devices, llama_log, sizing
from worker.engine.cache import tier
from worker.engine.context import NativeContext
from worker.engine.grammar import GrammarGate, TriggeredGate
from worker.engine.held import HeldPrefixes
from worker.engine.prompts import ChatPrompts
from worker.engine.protocol import Generation
from worker.engine.sampling import Sampler
from worker.engine.steps import plan, sequence
from worker.engine.steps.picks import Pick
from worker.engine.vision import encoder
from worker.settings import WorkerSettings
from worker.text import harmony, thinking
from worker.text.replies import Reply
from worker.tools.call_rules import only_calls
from worker.tools.harmony import HarmonyTools

log = logging.getLogger(__name__)


WARM_UP_MESSAGE = Message("user", "Write one line about the sea.")


class EngineConfigError(SystemExit):
    """The settings cannot work on this machine. It is said at start, before any job is taken."""


class LlamaEngine:
    def __init__(self, settings: WorkerSettings) -> None:
        assert settings.model_path is not None
        self.model_name = settings.model_name
        # per slot: what one job may use
        self.n_ctx = settings.n_ctx
        self._offloaded = bool(settings.n_gpu_layers) and llama_cpp.llama_supports_gpu_offload()
        self._prefill_chunk = settings.prefill_chunk
        llama_log.install()
        llama_cpp.llama_backend_init()
        most = llama_cpp.llama_max_parallel_sequences()
        if settings.slots is not None and not 1 <= settings.slots <= most:
            raise EngineConfigError(
                f"SLOTS={settings.slots}: llama.cpp supports 1 to {most} sequences per process"
            )
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = settings.n_gpu_layers
        self._model = LlamaModel(path_model=str(settings.model_path), params=mparams, verbose=False)
        template = settings.chat_template_file.read_text() if settings.chat_template_file else None
        self.prompts = ChatPrompts(self._model, template)
        self._thinking = settings.reasoning_format == "think"
        # gpt-oss's: split on them
        self.prompts.markers = self.prompts.marker_ids(harmony.MARKERS)
        self._harmony = bool(self.prompts.markers)
        self._marks = frozenset(self.prompts.controls) | frozenset(self.prompts.ends)
        log.info("tool calls: %s protocol (worker/tools/protocols.py)", self.prompts.tools.name)
        self.prompt_overhead: PromptOverhead | None = self.prompts.overhead(self.model_name)
        log.info("the chat template adds at most %s tokens to a prompt", self.prompt_overhead)
        self._n_vocab = self._model.n_vocab()
        cores = sizing.usable_cores()
        self.threads = sizing.threads(settings.n_threads, settings.n_threads_batch, cores)
        self.prompts.vision = encoder.load(settings, self._model.model, self.threads.n_threads_batch)
        per_slot = kv_cache_bytes(self._model, self.n_ctx)
        if settings.slots is not None:
            tries, why = [settings.slots], "SLOTS"
        # llama.cpp says whether the cache fits the GPU
        elif self._offloaded:
            tries, why = sizing.halvings(min(sizing.GPU_SLOTS, most)), "the GPU's memory"
        else:
            left = sizing.available_memory() - sizing.buffer_bytes(self._n_vocab)
            budget = int(settings.kv_memory_share * max(left, 0))
            tries = [min(sizing.slots_for(per_slot, budget, sizing.CPU_SLOTS), most)]
            why = (
                f"a {budget / 2**20:.0f} MiB KV budget at {per_slot / 2**20:.0f} MiB a slot, "
                f"at most {sizing.CPU_SLOTS}"
            )
        for slots in tries:
            self._ctx = self._context(settings, slots)
            if self._ctx:
                break
            log.info("no context for %d slots of %d tokens: trying fewer", slots, self.n_ctx)
        else:
            raise EngineConfigError(
                f"llama.cpp could not create a context for SLOTS={tries[-1]} x N_CTX={self.n_ctx} "
                "(out of memory?): lower SLOTS or N_CTX"
            )
        self.slots = slots
        log.info(
            "%d slots of %d tokens (from %s); %d/%d threads (one-token/batched steps) of %d usable cores",
            slots,
            self.n_ctx,
            why,
            self.threads.n_threads,
            self.threads.n_threads_batch,
            cores,
        )
        # what each slot's cache holds, for cache-aware routing
        self.held = HeldPrefixes(slots)
        self._prefix_cache = settings.prefix_cache
        kv, layers = kv_cache_bytes(self._model, slots * self.n_ctx), settings.n_gpu_layers
        self.placement = devices.placement(self._model.model, layers, kv, slots, self.n_ctx)
        log.info("%s", self.placement.describe())
        if llama_cpp.llama_n_ctx_seq(self._ctx) < self.n_ctx:
            raise EngineConfigError(
                f"llama.cpp gives each slot {llama_cpp.llama_n_ctx_seq(self._ctx)} tokens, "
                f"not N_CTX={self.n_ctx}"
            )
        context = NativeContext(self._ctx, self._n_vocab, kv_on_device=self._offloaded)
        self._scheduler = batching.Scheduler(
            context,
            self.slots,
            settings.prefill_chunk,
            self.prompts.is_end,
            prefix_cache=settings.prefix_cache,
            batch_prefill_chunk=settings.batch_prefill_chunk,
            prefill_alone=settings.prefill_alone,
            prefill_stretch=settings.prefill_stretch,
            lines_beside=settings.batch_share(self.slots),
            step_delay_s=settings.step_delay_s,
            held=self.held,
            host=tier.sized(context, settings.host_cache_mib if settings.prefix_cache else 0, self.held),
        )

    def _context(self, settings: WorkerSettings, slots: int):
        """A context of `slots` sequences of N_CTX tokens each (None: it does not fit)."""
        assert settings.model_path is not None
        n_batch = plan.batch_capacity(slots, settings.prefill_chunk, settings.prefill_alone)
        # a step's rows in one pass up to it
        n_ubatch = min(n_batch, sizing.MAX_UBATCH)
        # on a GPU llama.cpp finds out at start itself
        if not self._offloaded:
            kv = kv_cache_bytes(self._model, slots * self.n_ctx)
            buffers = sizing.buffer_bytes(self._n_vocab, n_ubatch)
            weights = settings.model_path.stat().st_size
            if why := sizing.shortfall(kv, buffers, weights, f"SLOTS={slots} x N_CTX={self.n_ctx}"):
                raise EngineConfigError(why)
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = slots * self.n_ctx
        cparams.n_seq_max = slots
        # each slot attends over its own part of the cache only
        cparams.kv_unified = False
        cparams.n_batch, cparams.n_ubatch = n_batch, n_ubatch
        cparams.n_threads = self.threads.n_threads
        cparams.n_threads_batch = self.threads.n_threads_batch
        return llama_cpp.llama_init_from_model(self._model.model, cparams) or None

    def prompt_ids(self, spec: JobSpec) -> list[int]:
        """The prompt as the model sees it. Raises PromptTooLong if nothing fits after it."""
        return self.prompts.prompt_ids(spec, self.n_ctx)

    def is_end(self, token: int) -> bool:
        return self.prompts.is_end(token)

    def reply(self, spec: JobSpec, prompt: list[int]) -> Reply:
        """How the job's answer is read: thinking, content and tool calls. See worker/text/replies.py and
        worker/text/thinking.py. Whether the prompt opened a thinking block is read from its end. Some
        outputs their grammar would hold from the first token. They are a response format, or forced or
        JSON-envelope tool calls. When the prompt opened a block, they are held from the block's close on
        (`tokens`). Otherwise they are all answer."""
        tools = self.prompts.tools
        reply = tools.reply(spec)
        if not self._thinking or spec.kind != "chat":
            return reply
        # gpt-oss's channels
        if self._harmony and isinstance(tools, HarmonyTools):
            return tools.reader(spec, reply, harmony.opened_channel(self._prompt_tail(prompt)))
        opened = thinking.opened_by(self._prompt_tail(prompt))
        # a grammar from the first token (a response format or tools, without a trigger; not
        # built here: tokens() builds it, once) holds after the thinking when the prompt opened
        # a block, and from the first token otherwise: all answer
        constrained = tools.trigger(spec) is None and (spec.uses_tools or spec.response_format is not None)
        return thinking.Thinking(reply, opened) if opened or not constrained else reply

    def _grammar(self, spec: JobSpec, prompt: Sequence[int]) -> tuple[str | None, str | None]:
        """The job's grammar and the text it applies from. None: the first token (after thinking, if open)."""
        tools = self.prompts.tools
        # its grammars know where thinking ends
        if self._harmony and isinstance(tools, HarmonyTools):
            return tools.grammar(spec, harmony.opened_channel(self._prompt_tail(prompt))), tools.trigger(spec)
        grammar, trigger = tools.grammar(spec), tools.trigger(spec)
        chat = self._thinking and spec.kind == "chat"
        if grammar and trigger is None and chat and thinking.opened_by(self._prompt_tail(prompt)):
            return thinking.grammar_after(grammar), thinking.CLOSE
        return grammar, trigger

    def _prompt_tail(self, prompt: Sequence[int]) -> str:
        tail = b"".join(self.piece(t) for t in thinking.generation_prompt(list(prompt), self._marks))
        return tail.decode("utf-8", "replace")

    def tokens(self, job: Generation) -> Generator[tuple[Pick, bytes]]:
        """Sample after the prompt and what earlier attempts generated, in the running batch. It
        samples until the slot's window is full, though the caller stops earlier. Closing the
        iterator frees the slot at the next step. A job with a grammar replays `prior` through it
        first. It raises GrammarDeadEnd if that text does not fit it. `progress` is called from the
        scheduler's thread, even for a step that reads none of the job yet."""
        spec, prompt, prior = job.spec, job.prompt, job.prior
        grammar, trigger = self._grammar(spec, prompt)
        gate: GrammarGate | TriggeredGate | None = None
        if grammar and trigger:
            gate = TriggeredGate(
                lambda: GrammarGate(self._model.vocab, grammar, self.prompts.controls),
                trigger.encode(),
                self.piece,
            )
        elif grammar:
            gate = GrammarGate(self._model.vocab, grammar, self.prompts.controls)
        # as llama-server does it: the end tokens biased out of every pick
        if spec.ignore_eos:
            banned = {t: -100.0 for t in self.prompts.ends}
            spec = dataclasses.replace(
                spec, logit_bias=tuple(sorted({**dict(spec.logit_bias), **banned}.items()))
            )
        try:
            sampler = Sampler(spec, self._n_vocab, self.n_ctx, prior, gate, self.prompts.is_end)
        except BaseException:
            if gate is not None:
                gate.close()
            raise
        context = [*prompt, *prior]
        seq = sequence.Sequence(
            context=context,
            sampler=sampler,
            room=self.n_ctx - len(context),
            yields=spec.priority == BATCH,
            scope=spec.cache_scope,
            public=self.prompts.public_tokens(spec, prompt),
            alone_for=job.alone_for,
            since=job.since_ms,
            progress=job.progress,
            # an image's rows by position (vision/prompt.py)
            images=getattr(prompt, "images", {}),
        )
        self._scheduler.submit(seq)
        answer: list[bytes] = []
        try:
            for pick in seq:
                piece = self.prompts.piece(pick.token)
                answer.append(piece)
                yield pick, piece
        finally:
            self._scheduler.close(seq)
            if job.cached is not None:
                job.cached(seq.cached)
            # its prompt was read whole: the cache holds it
            if self._prefix_cache and answer:
                # an answer of text alone is what the next turn's assistant message will be
                plain = not spec.stop and not spec.uses_tools and not prior
                text = b"".join(answer).decode("utf-8", "replace") if plain else None
                if (
                    self._thinking
                    and text
                    and (self._harmony or thinking.OPEN in text or thinking.CLOSE in text)
                ):
                    # the next turn's message holds the answer alone
                    text = None
                # its first digest is any scope's
                public = spec.public_prompt and spec.kind == "chat"
                self.held.held(seq, [d for d, _ in prefixes(spec, text)], public)

    def piece(self, token: int) -> bytes:
        return self.prompts.piece(token)

    def edited(self, spec: JobSpec) -> tuple[JobSpec, tuple[int, int]]:
        """A job as its context edit leaves it, and what the edit cleared."""
        return self.prompts.edited(spec)

    def close_thinking(self, spec: JobSpec) -> list[int]:
        """A thinking block's close as the model writes it. Under a grammar of calls, harmony's is a start."""
        if self._harmony:
            return self.prompts.special_text(
                harmony.START + "assistant" if only_calls(spec) else harmony.CLOSING
            )
        return self.prompts.special_text(thinking.CLOSING)

    def warm_up(self, budget_s: float = 30.0, until: Callable[[], bool] = lambda: False) -> float:
        """Before the worker announces itself, run each shape of step a job meets. One step reads prompt
        tokens in every slot (batched prefill). Others read one token per slot (batched decode), or run
        one slot alone (the one-sequence threads). Picks are both greedy and sampled. Then it empties the
        whole KV cache and zeroes the counters. The cache is written over: its pages are mapped, and no
        job inherits the warm-up's tokens.

        What it is for is loaded at first use. On a GPU, CUDA kernels and cuBLAS handles load at each
        shape's first decode. Anywhere, the weights of a model file mapped from a cold disk load at the
        first decode. Their cost moves from the first job to before the worker is counted. On a GPU each
        slot reads a whole prefill chunk, the largest step there is. A CPU loads nothing lazily but the
        pages, so there each slot reads two tokens. There the first job is as fast as any without a
        warm-up. The warm-up's time is added to a scale from zero (docs/benchmarks.md has both). It stops
        between steps once `budget_s` has passed, or once `until()` says a job is waiting. That job's
        client waits, and the job meets only the shapes it uses. In a crash storm, each new worker's
        warm-up held the dead one's jobs back. Returns the seconds it took."""
        started = time.monotonic()
        deadline = started + budget_s
        if until():
            log.info("no warm-up: a job is waiting")
            return 0.0
        # once a job waited, every slot's run stops (it may be taken since)
        waited = threading.Event()

        def waiting() -> bool:
            if not waited.is_set() and until():
                waited.set()
            return waited.is_set()

        ids = self.prompts.prompt_ids(
            JobSpec(id="warm-up", kind="chat", model=self.model_name, messages=(WARM_UP_MESSAGE,)), self.n_ctx
        )
        width = self._prefill_chunk if self._offloaded else 2

        def run(slot: int, tokens: int) -> None:
            spec = JobSpec(
                id=f"warm-up-{slot}",
                kind="chat",
                model=self.model_name,
                messages=(WARM_UP_MESSAGE,),
                temperature=0.0 if slot % 2 == 0 else 0.8,
                top_p=1.0 if slot % 2 == 0 else 0.9,
                seed=slot,
            )
            # A prompt of its own per slot, so that no slot shares another's prefix.
            prompt = [ids[(slot + i) % len(ids)] for i in range(min(width, self.n_ctx - tokens))]
            stream = self.tokens(Generation(spec, prompt))
            try:
                for n, _ in enumerate(stream, 1):
                    if n >= tokens or time.monotonic() > deadline or waiting():
                        break
            finally:
                stream.close()

        together = [threading.Thread(target=run, args=(slot, 3)) for slot in range(self.slots)]
        for t in together:
            t.start()
        for t in together:
            t.join()
        if time.monotonic() < deadline and not waiting():
            # alone
            run(0, 2)
        self._scheduler.wait_idle()
        self._scheduler.reset()
        took = time.monotonic() - started
        cut = " (cut short: WARM_UP_SECONDS ran out)" if took > budget_s else ""
        cut = " (cut short: a job is waiting)" if waited.is_set() else cut
        log.info(
            "warm in %.2fs%s (%d slots reading %d tokens each, then decoding; the KV cache emptied)",
            took,
            cut,
            self.slots,
            width,
        )
        return took

    def step_ms(self) -> float:
        """The last batch step's time, in ms."""
        return self._scheduler.last_step_s * 1000

    def counters(self) -> BatchCounters:
        """The scheduler's live counters. The presence thread adds them to /metrics."""
        return self._scheduler.counters

    def close(self) -> None:
        self._scheduler.stop()


# f16 keys and values
_KV_BYTES = 2


def kv_cache_bytes(model: LlamaModel, tokens: int) -> int:
    """Keys and values of every layer for `tokens` positions (f16, as llama.cpp allocates)."""
    m = model.model
    head_dim = llama_cpp.llama_model_n_embd(m) // llama_cpp.llama_model_n_head(m)
    per_token = llama_cpp.llama_model_n_layer(m) * 2 * llama_cpp.llama_model_n_head_kv(m) * head_dim
    return per_token * _KV_BYTES * tokens
