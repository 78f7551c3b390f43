"""Lending the slots kept for interactive jobs to Batch API lines, and calling them back.

Of a worker's SLOTS, BATCH_SLOTS may run batch lines beside interactive jobs. The others stay
free, so an interactive job never waits behind a batch. Lines may take BATCH_LEND_SLOTS (default
half the slots) once no interactive job runs here and none has started for
BATCH_LEND_AFTER_SECONDS. A batch alone then steps 16 rows at a time on a 32-slot worker, not 8.
On a CPU, a row costs less in a larger step.

When an interactive job starts, the worker takes no more lines past BATCH_SLOTS. The lines beyond
BATCH_SLOTS sit out its steps (worker/engine/steps/plan.py `stepping`). Its stream shares each
step with BATCH_SLOTS lines, as if nothing were lent. The slots beyond BATCH_LEND_SLOTS stay free,
so the job finds a slot at once. The quiet spell is there for a worker that serves a steady
trickle of interactive jobs. Without it, the worker would take lines in each gap, only to stop
them at the next job.

While a lent slot is in use and every slot is taken, the worker looks at its model's interactive
queues every PREEMPT_POLL_SECONDS. With BATCH_LEND_SLOTS=SLOTS, every slot is lent. When a job
waits there, one batch line is preempted, and the interactive job takes the slot it frees. The
preempted line gives its job back at its next token. What it generated is kept, and the job goes
to the front of the batch queue. This does not count as a failure. The worker then lends nothing
for BATCH_LEND_AFTER_SECONDS. A job counts as waiting once it is seen at the head of its queue on
two looks in a row. So a job that an idle worker is about to take costs no batch line.

Workers of a pool see the same waiting job. Only the one that wins a short claim on its id
(SET NX) preempts. So one job costs one batch line its place, not one per worker.
"""

from __future__ import annotations

import time

import redis

from contract import keys, tiers
from contract.entries import as_text

# a waiting job's callback claim: long enough for the slot it frees to take it
CLAIM_MS = 2000


class Lending:
    def __init__(
        self,
        connection: redis.Redis,
        model: str,
        worker: str,
        *,
        batch_slots: int,
        lend_slots: int,
        lend_after_s: float,
        poll_s: float,
    ) -> None:
        self._r = connection
        self._batch_slots, self._lend_slots = batch_slots, lend_slots
        self._lend_after = lend_after_s
        self.poll_s = poll_s
        not_interactive = {tiers.queue_name(model, tiers.BATCH), tiers.suspect_queue_name(model)}
        # the suspect queue holds batch lines too: it is not counted as interactive demand
        self.interactive_queues = [
            keys.rq_queue_key(n) for n in tiers.worker_queue_names(model, worker) if n not in not_interactive
        ]
        # a new worker lends only after a quiet while
        self._last_interactive = time.monotonic()
        # the waiting job the last look found
        self._seen: str | None = None

    def interactive_started(self) -> None:
        """An interactive job started here: keep its slots free for a while."""
        self._last_interactive = time.monotonic()

    def batch_limit(self, interactive_running: bool) -> int:
        """How many batch lines may run here now. It is BATCH_LEND_SLOTS once no interactive
        job runs and none has started for BATCH_LEND_AFTER_SECONDS (0: never). Else it is
        BATCH_SLOTS."""
        quiet = time.monotonic() - self._last_interactive >= self._lend_after
        lend = self._lend_after > 0 and quiet and not interactive_running
        return self._lend_slots if lend else self._batch_slots

    def lent(self, running_batch_lines: int) -> bool:
        """Whether batch lines hold a slot kept for interactive jobs."""
        return running_batch_lines > self._batch_slots

    def call_back(self) -> str | None:
        """The RQ id of an interactive job that waits in this model's queues. This worker has
        claimed it, to make room for it. A job waits once it is seen at the head on two
        looks in a row. So a job that an idle worker is about to take does not wait. None if
        none waits, or another worker claimed it. One round trip to look, one more to claim."""
        with self._r.pipeline(transaction=False) as pipe:
            for queue in self.interactive_queues:
                pipe.lindex(queue, 0)
            heads = pipe.execute()
        waiting = next((as_text(h) for h in heads if h is not None), None)
        seen, self._seen = self._seen, waiting
        if waiting is None or waiting != seen:
            return None
        return waiting if self._r.set(keys.callback(waiting), 1, nx=True, px=CLAIM_MS) else None
