"""An attempt at an embed job: tokenize its inputs, embed them (beside other jobs' inputs:
worker/engine/embedding/engine.py) and end the job with every vector in its terminal entry.

It writes no deltas: a worker that dies mid-way leaves nothing half-said, and the next attempt
embeds the same inputs again, to the same vectors (one decode's sequences never see each
other), so a client gets one answer whichever attempt gives it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from contract.entries import CANCELLED, STOP
from contract.jobspec import JobSpec
from contract.tiers import BATCH
from worker.attempts.claims import Attempt, Claims
from worker.attempts.publisher import Publisher
from worker.errors import PromptRejected

REJECTED = "rejected"


class Embedder(Protocol):
    dimensions: int  # of the model's vectors

    def input_ids(self, spec: JobSpec) -> list[list[int]]: ...
    def embed(
        self,
        inputs: list[list[int]],
        dimensions: int = 0,
        progress: Callable[[], None] | None = None,
        batch: bool = False,
    ) -> bytes: ...


def run(
    embedder: Embedder,
    claims: Claims,
    pub: Publisher,
    settle_claim: Callable[[Attempt], None],
    spec: JobSpec,
    attempt: Attempt,
) -> str:
    """Run the claimed attempt to its end; returns how it ended (an `Outcome` value)."""
    progress = claims.progress(spec.id)
    attempt.saw(progress.last_id)
    try:
        inputs = embedder.input_ids(spec)
    except PromptRejected as exc:
        pub.failed(attempt, exc.error, str(exc), exc.param)
        return REJECTED
    tokens = sum(map(len, inputs))
    settle_claim(attempt)
    pub.started(attempt, tokens, after=progress.last_id)
    if attempt.cancelled:
        pub.finished(attempt, CANCELLED, tokens, 0)
        return CANCELLED

    def alive() -> None:
        attempt.progress_at = time.monotonic()

    vectors = embedder.embed(inputs, spec.dimensions, alive, batch=spec.priority == BATCH)
    attempt.progress_at = time.monotonic()
    pub.finished(attempt, STOP, tokens, 0, vectors=vectors, dimensions=spec.dimensions or embedder.dimensions)
    return STOP
