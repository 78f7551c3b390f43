"""Whether a new job may enter a model's queue: the model must be served (or allowed to scale
from zero), its queue must have room, and the caller's key must be under its limits. A
refusal enqueues nothing."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator

import redis.asyncio as aredis

from api.errors import APIError
from api.registry import WorkerRegistry
from api.settings import Settings
from contract import errors, keys


class OpenStreams:
    """The SSE streams this process relays, per API key (for MAX_STREAMS_PER_KEY)."""

    def __init__(self) -> None:
        self._by_owner: collections.Counter[str] = collections.Counter()

    def count(self, owner: str) -> int:
        return self._by_owner[owner]

    @contextlib.contextmanager
    def held(self, owner: str) -> Iterator[None]:
        self._by_owner[owner] += 1
        try:
            yield
        finally:
            self._by_owner[owner] -= 1
            if self._by_owner[owner] <= 0:
                del self._by_owner[owner]


class Admission:
    def __init__(
        self, client: aredis.Redis, registry: WorkerRegistry, streams: OpenStreams, settings: Settings
    ) -> None:
        self._r = client
        self._registry = registry
        self._streams = streams
        self._settings = settings

    async def models(self, names: list[str] | None = None) -> dict[str, int]:
        """Model -> live workers, for the models a client may ask for: those with a worker that
        announced itself recently, and the configured KNOWN_MODELS (0 workers: they scale from
        zero, their jobs wait in the queue)."""
        live = await self._registry.live_models(names)
        known = [m for m in self._settings.known_models if names is None or m in names]
        return {**dict.fromkeys(known, 0), **live}

    async def model(self, model: str) -> None:
        """Raise 404 for a model nobody serves, 429 (with Retry-After) when its queue is full.

        The depth check and the enqueue are separate steps, so concurrent requests across API
        replicas may overshoot the limit by as many requests as are in flight at that moment."""
        async with self._r.pipeline(transaction=False) as pipe:  # one round trip
            self._registry.count_live(pipe, model)
            for queue in keys.queue_keys(model):
                pipe.llen(queue)
            workers, *depths = await pipe.execute()
        depth = sum(depths)
        if not workers and model not in self._settings.known_models:
            raise not_found(model)
        limit = self._settings.queue_limit(model)
        if 0 < limit <= depth:
            raise self._too_many(
                errors.QUEUE_FULL,
                f"The queue for '{model}' is full ({depth} requests waiting); retry after "
                f"{self._settings.retry_after_s} seconds.",
            )

    def stream(self, owner: str) -> None:
        """Raise 429 when this API key already holds MAX_STREAMS_PER_KEY open streams on this
        API process (counted per process: N replicas allow up to N times as many). Without API
        keys there is no per-key limit."""
        limit = self._settings.max_streams_per_key
        open_streams = self._streams.count(owner)
        if owner and limit > 0 and open_streams >= limit:
            raise self._too_many(
                errors.TOO_MANY_STREAMS,
                f"Too many open streams for this API key ({open_streams}; the limit is {limit}).",
            )

    def jobs(self, unfinished: int) -> APIError:
        """The refusal of a job over MAX_JOBS_PER_KEY (checked with the job's record, in one
        atomic step across replicas: contract.scripts.SUBMIT)."""
        return self._too_many(
            errors.TOO_MANY_JOBS,
            f"Too many unfinished requests for this API key ({unfinished}; the limit is "
            f"{self._settings.max_jobs_per_key}).",
        )

    def _too_many(self, error: errors.ErrorCode, message: str) -> APIError:
        return APIError(error, message, headers={"Retry-After": str(self._settings.retry_after_s)})


def not_found(model: str) -> APIError:
    return APIError(
        errors.MODEL_NOT_FOUND, f"The model '{model}' does not exist or no worker serves it.", param="model"
    )
