"""Lending the slots kept for interactive jobs to Batch API lines, and calling them back.

Of a worker's SLOTS, BATCH_SLOTS may run batch lines; the others stay free, so an
interactive job never waits behind a batch. With BATCH_LEND_AFTER_SECONDS set (off by
default: docs/benchmarks.md weighs it), once no interactive job has started here for that
long, those slots are lent to batch lines too: a batch alone uses every slot. While a lent
slot is in use and every slot is taken, the worker looks at its model's interactive queues
every PREEMPT_POLL_SECONDS; when a job waits there, one batch line is preempted (it gives
its job back at its next token: what it generated is kept, the job goes to the front of the
batch queue, and this does not count as a failure) and the interactive job takes the slot
it frees. The worker then lends nothing for BATCH_LEND_AFTER_SECONDS. A job counts as
waiting once it is seen at the head of its queue on two looks in a row: one an idle worker
is about to take costs no batch line.

Workers of a pool see the same waiting job: only the one that wins a short claim on its id
(SET NX) preempts, so one job costs one batch line its place, not one per worker.
"""

from __future__ import annotations

import time

import redis

from contract import keys
from contract.entries import as_text

CLAIM_MS = 2000  # a waiting job's callback claim: long enough for the slot it frees to take it


class Lending:
    def __init__(
        self,
        connection: redis.Redis,
        model: str,
        *,
        slots: int,
        batch_slots: int,
        lend_after_s: float,
        poll_s: float,
    ) -> None:
        self._r = connection
        self._slots, self._batch_slots = slots, batch_slots
        self._lend_after = lend_after_s
        self.poll_s = poll_s
        not_interactive = {keys.queue_name(model, keys.BATCH), keys.suspect_queue_name(model)}
        self.interactive_queues = [
            keys.rq_queue_key(n) for n in keys.queue_names(model) if n not in not_interactive
        ]  # the suspect queue holds batch lines too: it is not counted as interactive demand
        self._last_interactive = time.monotonic()  # a new worker lends only after a quiet while
        self._seen: str | None = None  # the waiting job the last look found

    def interactive_started(self) -> None:
        """An interactive job started here: keep its slots free for a while."""
        self._last_interactive = time.monotonic()

    def batch_limit(self) -> int:
        """How many batch lines may run here now: every slot once interactive jobs have been
        quiet for BATCH_LEND_AFTER_SECONDS (0: never), else BATCH_SLOTS."""
        quiet = time.monotonic() - self._last_interactive
        return self._slots if self._lend_after > 0 and quiet >= self._lend_after else self._batch_slots

    def lent(self, running_batch_lines: int) -> bool:
        """Whether batch lines hold a slot kept for interactive jobs."""
        return running_batch_lines > self._batch_slots

    def call_back(self) -> str | None:
        """The RQ id of an interactive job that waits in this model's queues (seen at the
        head on two looks in a row: a job an idle worker is about to take is not) and that
        this worker has claimed to make room for; None if none waits, or another worker
        claimed it. One round trip to look, one more to claim."""
        with self._r.pipeline(transaction=False) as pipe:
            for queue in self.interactive_queues:
                pipe.lindex(queue, 0)
            heads = pipe.execute()
        waiting = next((as_text(h) for h in heads if h is not None), None)
        seen, self._seen = self._seen, waiting
        if waiting is None or waiting != seen:
            return None
        return waiting if self._r.set(keys.callback(waiting), 1, nx=True, px=CLAIM_MS) else None
