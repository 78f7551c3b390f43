"""Announces, every few seconds, that this worker serves its model.

Each announcement says how many slots the worker has and how busy it is. It says where its
model and KV cache are. It also says which prompt prefixes its slots hold, for cache-aware
routing.
The job's own thread rewrites that set when the job ends, before its terminal entry is
published. The set expires with the worker's last announcement.

The API lists and accepts only models with a recent announcement. It sums the slots of the
live workers for /metrics. Each announcement also adds to the cluster's counters what the
batching scheduler did since the last one. That costs one round trip every few seconds, none
per step. It runs in its own thread with its own connection. So it keeps going while
llama.cpp computes (ctypes releases the GIL), and stops the moment the process dies.

Before all that, a worker says only that it is starting (`Starting`). It does so while it
fetches, loads and warms its model. That is capacity coming, which requeued jobs wait for.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict

import redis

from contract import keys, stats, tiers
from contract.prefixes import PromptOverhead
from contract.stats import BatchCounters
from worker.engine.held import HeldPrefixes
from worker.engine.protocol import Placement
from worker.redis.periodic import Periodic

# the API's WORKER_STALE_SECONDS: a silent worker's prefixes go with it
HELD_TTL_S = 15.0
# a thread past its job's end counts as running again after this (it publishes)
ENDING_S = 10.0


class Presence:
    def __init__(
        self,
        client: redis.Redis,
        model: str,
        worker: str,
        every_s: float,
        slots: int = 1,
        counters: Callable[[], BatchCounters] = BatchCounters,
        n_ctx: int = 0,
        overhead: PromptOverhead | None = None,
        placement: Placement | None = None,
        held: HeldPrefixes | None = None,
        load: Callable[[], tuple[int, float]] = lambda: (0, 0.0),
        held_ttl_s: float = HELD_TTL_S,
        vision: int = 0,
    ) -> None:
        self._r = client
        self._model = model
        self._worker = worker
        self._slots = slots
        # each job's context: the API bounds prompts by it
        self._n_ctx = n_ctx
        # what its chat template adds: the API bounds reservations by it
        self._overhead = overhead
        # what the model put where, for /metrics
        self._placement = placement
        # the most tokens an image becomes (0: it reads no images)
        self._vision = vision
        # the prefixes its slots hold (worker/engine/held.py), for routing
        self._held = held
        # the version last written
        self._held_version = -1
        self._held_ttl_ms = int(held_ttl_s * 1000)
        # (slots in use, the last step's ms), for routing and the pool view
        self._load = load
        # read from the scheduler thread's live counters
        self._counters = counters
        self._flushed = BatchCounters()
        # a job's thread writes the held set too (held_changed)
        self._lock = threading.Lock()
        # the last write of it failed: left to this thread then
        self._held_failing = False
        # job threads past their job's end (they said what their slot holds) that `load`
        # still counts while they publish its terminal entry: free for routing already
        # -> when (monotonic)
        self._ending: dict[threading.Thread, float] = {}
        # a poke (a job ended: its prefixes are held) announces within 0.2 s, once for a burst
        self._thread = Periodic("presence", every_s, self.announce, min_gap_s=0.2)

    def announce(self) -> None:
        with self._lock:
            self._announce()
        self._held_failing = False

    def _in_use(self) -> tuple[int, float]:
        """(slots in use, the last step's ms), with a job past its end counted out. Call with
        the lock held."""
        in_use, step_ms = self._load()
        since = time.monotonic() - ENDING_S
        self._ending = {t: at for t, at in self._ending.items() if t.is_alive() and at > since}
        return max(0, in_use - len(self._ending)), step_ms

    def _load_field(self, now: BatchCounters) -> str:
        in_use, step_ms = self._in_use()
        return f"{in_use} {step_ms:.1f} {now.prompt_tokens} {now.cached_tokens} {now.host_bytes}"

    def _announce(self) -> None:
        now = BatchCounters(**asdict(self._counters()))
        with self._r.pipeline(transaction=True) as pipe:
            pipe.sadd(keys.MODELS, self._model)
            pipe.zadd(keys.workers(self._model), {self._worker: int(time.time() * 1000)})
            pipe.hset(keys.worker_slots(self._model), self._worker, self._slots)
            if self._n_ctx:
                pipe.hset(
                    keys.context(self._model),
                    mapping={self._worker: self._n_ctx, keys.LAST_CONTEXT: self._n_ctx},
                )
            if self._overhead is not None:
                said = self._overhead.field()
                pipe.hset(
                    keys.prompt_overhead(self._model), mapping={self._worker: said, keys.LAST_CONTEXT: said}
                )
            if self._placement is not None:
                placed = f"{self._placement.gpu_layers} {self._placement.kv_bytes}"
                pipe.hset(keys.worker_placement(self._model), self._worker, placed)
            if self._vision:
                pipe.hset(keys.worker_vision(self._model), self._worker, self._vision)
            pipe.hset(keys.worker_load(self._model), self._worker, self._load_field(now))
            version, kept_alive = self._announce_held(pipe)
            for name, value in asdict(now).items():
                if name not in stats.LEVELS and (added := value - getattr(self._flushed, name)):
                    pipe.hincrby(keys.STATS, stats.StatField.batch(name, self._model), added)
            done = pipe.execute()
        self._flushed = now
        # a set that was gone (expired through an outage, deleted by the reaper) is written
        # whole next time
        self._held_version = version if kept_alive is None or done[kept_alive] else -1

    def _announce_held(self, pipe: redis.client.Pipeline) -> tuple[int, int | None]:
        """The held prefixes: the whole set again when it changed, else only kept alive.
        Returns the version written and the index in the pipeline of the set's keep-alive.
        The set should exist when the keep-alive runs. The index is None when the set is
        empty."""
        if self._held is None:
            return self._held_version, None
        key = keys.held_prefixes(self._worker)
        version, digests = self._held.digests()
        if version != self._held_version:
            pipe.delete(key)
            if digests:
                pipe.sadd(key, *digests)
        pipe.pexpire(key, self._held_ttl_ms)
        return version, len(pipe.command_stack) - 1 if digests else None

    def held_changed(self) -> None:
        """A job ended holding prefixes: the set is written now. This runs on the job's own
        thread, before its terminal entry is published. So the conversation's next turn,
        sent the moment the answer ends, is routed here. Through an outage the write is left
        to the presence thread. That thread is poked either way (the job's counters go with
        its announcement). The job's slot is free for routing from now on (its thread only
        publishes the end). The load written with the set says so. Else the next turn finds
        this worker full."""
        with self._lock:
            self._ending[threading.current_thread()] = time.monotonic()
        if not self._held_failing:
            try:
                with self._lock, self._r.pipeline(transaction=True) as pipe:
                    version, kept_alive = self._announce_held(pipe)
                    # else another thread wrote it
                    if version != self._held_version:
                        flushed = self._flushed
                        pipe.hset(keys.worker_load(self._model), self._worker, self._load_field(flushed))
                        done = pipe.execute()
                        self._held_version = version if kept_alive is None or done[kept_alive] else -1
            except redis.RedisError:
                self._held_failing = True
        self.poke()

    def withdraw(self) -> None:
        """The worker takes no more jobs. Its held prefixes go now, so none is routed here."""
        if self._held is not None:
            self._held.close()
            self.poke()

    def poke(self) -> None:
        """Announce now (the held prefixes changed)."""
        self._thread.poke()

    def start(self) -> None:
        """Announce now, and every period from then on (through Redis outages)."""
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()
        with contextlib.suppress(redis.RedisError):
            # the last counts
            self.announce()
            self._r.zrem(keys.workers(self._model), self._worker)
            self._r.hdel(keys.worker_slots(self._model), self._worker)
            self._r.hdel(keys.context(self._model), self._worker)
            self._r.hdel(keys.prompt_overhead(self._model), self._worker)
            self._r.hdel(keys.worker_placement(self._model), self._worker)
            self._r.hdel(keys.worker_vision(self._model), self._worker)
            self._r.hdel(keys.worker_load(self._model), self._worker)
            self._r.delete(keys.held_prefixes(self._worker))


class Starting:
    """Says that this worker is starting for its model (fetching, loading, warming it). It
    says so every few seconds, from the process's start until it serves. Jobs requeued while
    every warm worker is dead then wait for it (api/cluster/resumes.py). They do not end
    with `worker_lost`. Its connection is named like every worker's, so a start that dies
    stops counting at once."""

    # entries of starts that died are dropped after a day
    FORGET_MS = 86_400_000
    # `jobs_waiting` asks Redis at most this often
    LOOK_EVERY_S = 0.2

    def __init__(self, client: redis.Redis, model: str, worker: str, every_s: float) -> None:
        self._r, self._key, self._worker = client, keys.starting_workers(model), worker
        self._thread = Periodic("starting", every_s, self._say)
        self._queues = [
            keys.rq_queue_key(q)
            for q in tiers.queue_names(model)
            if q != tiers.queue_name(model, tiers.BATCH)
        ]
        self._looked, self._waiting = -math.inf, False

    def jobs_waiting(self) -> bool:
        """Whether a client waits for a job of the model, batch lines aside. Such a job is
        one in its queues. It is a dead worker's, requeued, or the one that scaled the pool
        from zero. The warm-up stops for it (worker/engine/model.py). The warm-up's threads call
        this. It asks Redis at most every LOOK_EVERY_S, and is False while Redis cannot say."""
        now = time.monotonic()
        if now - self._looked >= self.LOOK_EVERY_S:
            self._looked = now
            try:
                with self._r.pipeline(transaction=False) as pipe:
                    for queue in self._queues:
                        pipe.llen(queue)
                    self._waiting = any(pipe.execute())
            except redis.RedisError:
                self._waiting = False
        return self._waiting

    def _say(self) -> None:
        now = int(time.time() * 1000)
        with self._r.pipeline(transaction=False) as pipe:
            pipe.zadd(self._key, {self._worker: now})
            pipe.zremrangebyscore(self._key, "-inf", now - self.FORGET_MS)
            pipe.execute()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """It serves now (announced by its Presence), or it gave up."""
        self._thread.stop()
        with contextlib.suppress(redis.RedisError):
            self._r.zrem(self._key, self._worker)
        self._r.close()
