"""Continuous batching: one thread advances every running sequence in each `llama_decode`.

Each job in a worker is a sequence in its own slot. A slot is a llama.cpp sequence id with its own
part of the KV cache. Every step builds one batch. It holds the last sampled token of each decoding
sequence. It also holds up to `prefill_chunk` prompt tokens of each sequence still prefilling. So a
long prompt is spread over many steps and never freezes the running streams. The batch lists its
tokens by slot (worker/engine/steps/plan.py). One pass over a batch needs consecutive sequence ids
in increasing order. That is how llama.cpp computes a batch for a cache split by sequence. While an
interactive sequence runs, Batch API lines beyond BATCH_SLOTS sit out. After the decode, each
sequence that produced logits samples with its own sampler chain. A courier thread hands the step's
tokens to the job threads through their sequences' queues. It does so while the next step computes.
Each job thread woken from the scheduler thread preempts it. The model computes nothing meanwhile
(docs/benchmarks.md has the figures).

A closed sequence leaves at the next step: its slot takes the next job at once. A slot keeps the KV
of its last sequence. It serves the next job of its cache scope that shares a prefix with it. That
job reads only the rest. A cache scope is a key or salt. A public prompt's tokens are for any scope
(contract/prefixes.py). A job extending no cache takes an empty slot, else the least recently used
(`choose_slot`). A move may close a gap between running slots. It first copies the cache left there
to a spare slot (`spare_slot`). On CPU, neither the batch nor the cached prefix changes a job's
greedy tokens (tests/integration/test_batching.py). A GPU may round a batch otherwise.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from contract.stats import BatchCounters
from worker.engine.argmax import RowsArgmax, threads_for
from worker.engine.cache.tier import HostCache
from worker.engine.context import NativeContext, StepBatch
from worker.engine.held import HeldPrefixes
from worker.engine.sampling import pick_rows
from worker.engine.steps.cost import StepCost
from worker.engine.steps.plan import (
    batch_capacity,
    budgeted,
    choose_slot,
    common_prefix,
    compaction,
    plan,
    prefix_source,
    shareable,
    spare_slot,
    stepping,
)
from worker.engine.steps.sequence import END, Sequence
from worker.engine.vision.reading import read_images
from worker.errors import GrammarDeadEnd

log = logging.getLogger(__name__)


class EngineFailed(RuntimeError):
    """llama_decode failed. Every sequence of that batch is ended with this error."""


class Scheduler:
    def __init__(
        self,
        context: NativeContext,
        slots: int,
        prefill_chunk: int,
        is_end: Callable[[int], bool],
        prefix_cache: bool = True,
        batch_prefill_chunk: int | None = None,
        prefill_alone: int = 0,
        prefill_stretch: float = 0.0,
        lines_beside: int | None = None,
        step_delay_s: float = 0.0,
        held: HeldPrefixes | None = None,
        argmax_threads: int | None = None,
        host: HostCache | None = None,
    ) -> None:
        self._context = context
        self.slots = slots
        self._chunk = prefill_chunk
        self._batch_chunk = min(batch_prefill_chunk or prefill_chunk, prefill_chunk)
        # PREFILL_ALONE: a step's prompt rows while nothing decodes
        self._alone = prefill_alone
        self._is_end = is_end
        self._prefix_cache = prefix_cache
        self.cost = StepCost(prefill_stretch)
        self._lines_beside = lines_beside  # Batch API lines stepping beside interactive ones
        self._step_delay_s = step_delay_s  # STEP_DELAY_SECONDS: a slower machine, for the tests
        self._held = held  # what each slot's cache holds, for cache-aware routing (worker/engine/held.py)
        self._host = host if prefix_cache else None  # the host tier (worker/engine/cache/)
        self._interrupt = context.interrupt
        self._cut = False  # the last step was cut short: this one runs to its end (progress)
        self._batch = StepBatch(batch_capacity(slots, prefill_chunk, prefill_alone))
        self._argmax = RowsArgmax(argmax_threads or threads_for())  # the greedy rows' pass
        self._kv: list[list[int]] = [[] for _ in range(slots)]  # tokens in each slot's cache
        self._scopes = [""] * slots  # the cache scope of each slot's tokens
        self._ended = [0] * slots  # when each slot's last job ended (a tick; 0: never, or a stale copy)
        self._tick = 0
        self._free = list(range(slots))
        self._running: list[Sequence] = []
        self._waiting: list[Sequence] = []
        self._cv = threading.Condition()
        self._stopped = False
        self.counters = BatchCounters()  # written by the scheduler thread (and reset(), when idle)
        self.last_step_s = 0.0  # the last llama_decode's time (the pool view shows it)
        # what each step hands to the job threads, in order; None stops the courier
        self._outbox: queue.SimpleQueue[list[tuple[Sequence, object]] | None] = queue.SimpleQueue()
        self._courier = threading.Thread(target=self._deliver, name="batching-courier", daemon=True)
        self._courier.start()
        self._thread = threading.Thread(target=self._loop, name="batching", daemon=True)
        self._thread.start()

    # Called by job threads.

    def submit(self, seq: Sequence) -> Sequence:
        with self._cv:
            if self._stopped:
                raise EngineFailed("the engine is stopped")
            self._waiting.append(seq)
            self._cv.notify()
        if not seq.yields:  # a step with Batch API lines in it stops: its prompt goes first
            self._interrupt.fire()
        return seq

    def close(self, seq: Sequence) -> None:
        with self._cv:
            seq.closed = True
            self._cv.notify()

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Until every closed sequence has left (the loop retires them at its next turn)."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while (self._running or self._waiting) and time.monotonic() < deadline:
                self._cv.wait(timeout=0.01)

    def reset(self) -> None:
        """As if new: every slot's cache emptied and written over, the counters zeroed. No job reuses what
        came before. Every page of the cache is mapped before a job needs it. Only while nothing runs (the
        worker's warm-up)."""
        with self._cv:
            if self._running or self._waiting:
                raise RuntimeError("reset while sequences run")
            self._context.clear()
            for slot in range(self.slots):
                self._forget(slot)
            if self._host is not None:
                self._host.clear()
            self._tick = 0
            self.counters = BatchCounters()

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()
        self._thread.join(timeout=10)
        self._courier.join(timeout=10)
        self._argmax.close()

    # The courier thread.

    def _deliver(self) -> None:
        while (items := self._outbox.get()) is not None:
            for seq, item in items:
                seq.out.put(item)

    # The scheduler thread.

    def _loop(self) -> None:
        while True:
            try:
                with self._cv:
                    while not self._stopped and not self._has_work():
                        self._cv.wait()
                    if self._stopped:
                        break
                    self._retire_closed()
                    self._admit()
                    self._compact()
                if self._running:
                    self._step()
            except Exception as exc:  # never leave the jobs waiting on a dead thread
                log.exception("batch step failed")
                self._fail(EngineFailed(f"batch step failed: {type(exc).__name__}"))
        self._outbox.put([(seq, EngineFailed("the engine stopped")) for seq in self._running + self._waiting])
        self._outbox.put(None)

    def _has_work(self) -> bool:
        """Sequences to step or retire, or one waiting for a free slot."""
        return bool(self._running) or bool(self._waiting and self._free)

    def _retire_closed(self) -> None:
        for seq in [s for s in self._running if s.closed]:
            self._release(seq)
        for seq in [s for s in self._waiting if s.closed]:
            self._waiting.remove(seq)
            seq.sampler.close()

    def _release(self, seq: Sequence) -> None:
        self._running.remove(seq)
        seq.sampler.close()
        if not self._prefix_cache:
            self._forget(seq.slot)
        self._tick += 1
        self._ended[seq.slot] = self._tick
        self._free.append(seq.slot)

    def _forget(self, slot: int) -> None:
        self._context.remove(slot)
        self._kv[slot] = []
        self._ended[slot] = 0
        if self._held is not None:
            self._held.forget(slot)

    def _admit(self) -> None:
        """Give free slots to waiting sequences (`choose_slot`). Another slot's cache of the job's scope
        may hold more of the prompt than the slot taken. Then that prefix is copied in (`prefix_source`).
        No slot is evicted for it, and no prompt is read again meanwhile. A state kept in host memory may
        hold more still. Then it is restored into the slot (worker/engine/cache/tier.py). A conversation
        the slot held that the job does not extend is kept there first."""
        while self._waiting and self._free:
            seq = self._waiting.pop(0)
            shares = shareable(self._kv, self._scopes, seq.context, seq.scope, seq.public)
            slot = choose_slot(self._free, self._kv, seq.context, self._ended, shares)
            self._free.remove(slot)
            # the last context token is read again all the same: its logits give the first pick
            keep = min(common_prefix(self._kv[slot], seq.context), len(seq.context) - 1, shares[slot])
            keep = seq.image_at(keep)  # an image is read whole: a cache ending inside one is cut there
            source = prefix_source(slot, self._kv, seq.context, shares) if self._prefix_cache else None
            if self._host is not None and self._ended[slot]:  # a conversation, not a stale copy
                mine = self._scopes[slot] == seq.scope
                self._host.save(slot, self._kv[slot], self._scopes[slot], keep if mine else 0, self.counters)
            restored = None
            if self._host is not None:
                restored = self._host.restore(slot, seq.context, seq.scope, source[1] if source else keep)
            self._scopes[slot] = seq.scope
            if restored is not None:
                keep = seq.image_at(len(restored))
                if keep < len(restored):  # a state ending inside an image: cut at the image
                    self._context.remove(slot, keep)
                self._kv[slot] = list(restored[:keep])
                self.counters.host_hits += bool(restored)
                self.counters.host_restored_tokens += keep
            elif source:
                src, keep = source
                keep = seq.image_at(keep)
                self._context.copy_prefix(src, slot, keep)  # the source's cache stays whole
                self._kv[slot] = self._kv[src][:keep]
                self.counters.copied += 1
            else:
                self._context.remove(slot, keep)
                del self._kv[slot][keep:]
            seq.slot, seq.fed, seq.cached = slot, keep, keep
            self._running.append(seq)
            self.counters.prompt_tokens += len(seq.context)
            self.counters.cached_tokens += keep
            if self._held is not None:
                self._held.taken(slot, seq)

    def _compact(self) -> None:
        """Move sequences into the gaps `compaction` finds (see there for why)."""
        by_slot = {seq.slot: seq for seq in self._running}
        moves = compaction(list(by_slot), self._free)
        targets = {dst for _, dst in moves}
        for src, dst in moves:
            if self._prefix_cache and self._ended[dst]:  # a conversation, not a stale copy
                kept = self._keep(dst, targets)
                if not kept and self._host is not None:  # no spare slot for it: host memory, then
                    self._host.save(dst, self._kv[dst], self._scopes[dst], 0, self.counters)
            # llama.cpp copies the whole slot's KV at the next decode (copies run in the
            # order asked); the source keeps a stale copy, the first cache to be evicted.
            self._context.copy(src, dst)
            self._kv[dst] = list(self._kv[src])
            self._scopes[dst] = self._scopes[src]
            if self._held is not None:
                self._held.moved(src, dst)
            self._ended[src] = 0
            if not self._prefix_cache:
                self._forget(src)
            seq = by_slot.pop(src)
            seq.slot = dst
            by_slot[dst] = seq
            self._free.remove(dst)
            self._free.append(src)
            self.counters.moves += 1

    def _keep(self, gap: int, targets: set[int]) -> bool:
        """Copy the cache in `gap` to a spare free slot before a move writes over it. The cache is the
        conversation whose job just ended there. Its next turn may be on its way. The spare slot holds
        nothing, or an older conversation (`spare_slot`)."""
        spare = spare_slot(self._free, self._kv, self._ended, targets, self._ended[gap])
        if spare is None:
            return
        self._context.copy(gap, spare)
        self._kv[spare] = list(self._kv[gap])
        self._scopes[spare] = self._scopes[gap]
        self._ended[spare] = self._ended[gap]
        if self._held is not None:
            self._held.moved(gap, spare)
        self.counters.kept += 1
        return True

    def _step(self) -> None:
        """One decode of the planned tokens. Then every sequence with logits picks its token from the
        step's logits, read once (`pick_rows`)."""
        steps = stepping([s for s in self._running if not s.closed], self._lines_beside)
        most = 1 if any(s.pending is not None for s in steps) else None  # a stream waits on the step
        if (
            failed := read_images(self._context, self._batch.capacity, self._kv, steps, self.counters, most)
        ) is not None:
            self._fail(EngineFailed(f"llama_decode of an image returned {failed}"))
            return
        decoding = sum(s.pending is not None for s in steps)
        budget = self.cost.budget(decoding) if budgeted(steps) else None
        before = [(s, s.fed, s.pending, len(self._kv[s.slot])) for s in steps]
        rows = plan(steps, self._chunk, self._batch_chunk, budget, self._alone)
        if not rows:
            return
        outputs: list[Sequence] = []  # the rows with logits, in batch order: their logits' order
        tokens, positions, slots, wants = [], [], [], []
        for seq, token, logits in rows:
            kv = self._kv[seq.slot]
            tokens.append(token)
            positions.append(len(kv))
            slots.append(seq.slot)
            wants.append(logits)
            kv.append(token)
            if logits:
                outputs.append(seq)
        self._batch.fill(tokens, positions, slots, wants)
        if self._step_delay_s:
            time.sleep(self._step_delay_s)
        # stopped by `submit` when it holds Batch API lines, unless the last step was: that one
        # was planned again for the new job's prompt, and cutting every step would stop all
        # when jobs come faster than a step computes
        self._interrupt.arm(not self._cut and any(seq.yields for seq, _, _ in rows))
        started = time.perf_counter()
        rc = self._context.decode(self._batch)
        self._cut = self._interrupt.take() and rc == 2
        if self._cut:
            self._undo(before)
            return
        decoded = time.perf_counter()
        if rc != 0:
            self._fail(EngineFailed(f"llama_decode returned {rc}"))
            return
        # While a GPU computes the step: what does not need its logits
        for seq in steps:  # a prompt read a chunk a step is progress before its first token, and
            if seq.progress is not None:  # a continuation waiting its turn in the pool (plan.py)
                seq.progress()  # is no hung native call
        self._count(rows, decoding)
        logits = self._context.logits(len(outputs))  # waits for the step to be computed
        computed = time.perf_counter()
        self.last_step_s = computed - started
        self.counters.decode_us += int((decoded - started) * 1e6)
        self.counters.wait_us += int((computed - decoded) * 1e6)
        long_read = budget is not None and len(rows) > decoding and len(rows) - decoding <= budget
        self.cost.add(len(rows), computed - started, decoding, long_read)
        picks = pick_rows([seq.sampler for seq in outputs], logits, self._argmax)
        out: list[tuple[Sequence, object]] = []
        for seq, pick in zip(outputs, picks, strict=True):
            out.append((seq, pick))
            if isinstance(pick, GrammarDeadEnd):
                seq.closed = True
                continue
            seq.generated += 1
            if self._is_end(pick.token) or seq.generated >= seq.room:
                out.append((seq, END))
                seq.closed = True  # nothing more to compute; the job thread closes it too
            else:
                seq.pending = pick.token
        self._outbox.put(out)
        self.counters.sample_us += int((time.perf_counter() - computed) * 1e6)

    def _undo(self, before: list[tuple[Sequence, int, int | None, int]]) -> None:
        """A step stopped part way (worker/engine/interrupt.py): every sequence as before its plan. The
        cells of every micro-batch of the step are removed. llama.cpp removed the last's."""
        for seq, fed, pending, cached in before:
            self._context.remove(seq.slot, cached)
            del self._kv[seq.slot][cached:]
            seq.fed, seq.pending = fed, pending
        self.counters.interrupted += 1

    def _count(self, rows: list[tuple[Sequence, int, bool]], decoding: int) -> None:
        c = self.counters
        c.steps += 1
        c.sequences += len({id(seq) for seq, _, _ in rows})
        c.prefill_tokens += len(rows) - decoding

    def _fail(self, error: EngineFailed) -> None:
        """A failed decode may leave part of the batch in the cache: drop every sequence."""
        log.error("%s: ending the %d running sequences", error, len(self._running))
        with self._cv:
            self._outbox.put([(seq, error) for seq in self._running])
            for seq in list(self._running):
                seq.closed = True
                self._release(seq)
            for slot in range(self.slots):
                self._forget(slot)
