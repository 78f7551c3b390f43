"""An attempt at an embed job. It tokenizes the job's inputs and embeds them, beside other
jobs' inputs (worker/engine/embedding/engine.py). It ends the job with every vector in its
terminal entry.

It writes no deltas, so a worker that dies mid-way leaves nothing half-said. The next attempt
embeds the same inputs again. It gets the same vectors, since one decode's sequences never see
each other. So a client gets one answer whichever attempt gives it. While it waits for its
vectors, it still stops as any attempt does. It stops when fenced out, which the heartbeat
learns. It stops when cancelled: it asks, since it writes nothing that would tell it. It stops
past its deadline. It is given back at shutdown. A Batch API line is given back to make room
for an interactive job. What it had waiting is dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from contract import errors, queueing
from contract.entries import CANCELLED, STOP
from contract.jobspec import JobSpec
from contract.tiers import BATCH
from worker.attempts.attempt import Attempt, Claims
from worker.attempts.publisher import Publisher
from worker.errors import PromptRejected

REJECTED, DEADLINE = "rejected", "deadline_exceeded"
# shutting down: the caller gives the job back (`queueing.PREEMPT` too)
HAND_OFF = "handoff"
# how often a waiting attempt asks whether a cancel is due
CANCEL_POLL_S = 2.0


class Embedder(Protocol):
    # of the model's vectors
    dimensions: int

    def input_ids(self, spec: JobSpec) -> list[list[int]]: ...
    def embed(
        self,
        inputs: list[list[int]],
        dimensions: int = 0,
        progress: Callable[[], None] | None = None,
        batch: bool = False,
        stop: Callable[[], bool] | None = None,
        owner: str = "",
    ) -> bytes | None: ...


def run(
    embedder: Embedder,
    claims: Claims,
    pub: Publisher,
    settle_claim: Callable[[Attempt], None],
    spec: JobSpec,
    attempt: Attempt,
    shutdown_at: Callable[[], float | None],
) -> str:
    """Run the claimed attempt to its end, and return how it ended (an `Outcome` value).
    HAND_OFF or `queueing.PREEMPT` tell the caller to give the job back."""
    progress = claims.progress(spec.id)
    attempt.saw(progress.last_id)
    attempt.owner = progress.owner
    try:
        inputs = embedder.input_ids(spec)
    except PromptRejected as exc:
        pub.failed(attempt, exc.error, str(exc), exc.param)
        return REJECTED
    tokens = sum(map(len, inputs))
    settle_claim(attempt)
    pub.started(attempt, tokens, after=progress.last_id)
    attempt.move("start")
    asked = 0.0

    def cancelled() -> bool:
        nonlocal asked
        if attempt.cancelled or time.monotonic() - asked < CANCEL_POLL_S:
            return attempt.cancelled
        asked = time.monotonic()
        if claims.cancel_due(spec.id):
            attempt.move("cancel")
        return attempt.cancelled

    def why_stop() -> str | None:
        at = shutdown_at()
        if attempt.fenced:
            return "fenced"
        if at is not None and time.monotonic() >= at:
            return HAND_OFF
        if attempt.preempted:
            return queueing.PREEMPT
        if progress.deadline_ms is not None and time.time() * 1000 > progress.deadline_ms:
            return DEADLINE
        return CANCELLED if cancelled() else None

    def alive() -> None:
        attempt.progress_at = time.monotonic()

    if cancelled():
        pub.finished(attempt, CANCELLED, tokens, 0)
        return CANCELLED
    vectors = embedder.embed(
        inputs,
        spec.dimensions,
        alive,
        batch=spec.priority == BATCH,
        stop=lambda: why_stop() is not None,
        owner=progress.owner,
    )
    attempt.progress_at = time.monotonic()
    # stopped while it waited
    if vectors is None:
        # fenced: raises
        attempt.check()
        why = why_stop() or CANCELLED
        if why == CANCELLED:
            pub.finished(attempt, CANCELLED, tokens, 0)
        elif why == DEADLINE:
            pub.failed(attempt, errors.DEADLINE)
        return why
    pub.finished(attempt, STOP, tokens, 0, vectors=vectors, dimensions=spec.dimensions or embedder.dimensions)
    return STOP
