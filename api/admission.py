"""Whether a new job may enter a model's queue: the model must be served (or allowed to
scale from zero) and its queue must have room. Refusals enqueue nothing."""

from __future__ import annotations

from api.errors import APIError
from api.jobs import JobStore
from api.settings import Settings


async def models(store: JobStore, settings: Settings, names: list[str] | None = None) -> dict[str, int]:
    """Model -> live workers, for the models a client may ask for: those with a worker that
    announced itself recently, and the configured KNOWN_MODELS (0 workers: they scale from
    zero, their jobs wait in the queue)."""
    live = await store.live_models(names)
    known = [m for m in settings.known_models if names is None or m in names]
    return {**dict.fromkeys(known, 0), **live}


def not_found(model: str) -> APIError:
    return APIError(
        404,
        f"The model '{model}' does not exist or no worker serves it.",
        code="model_not_found",
        param="model",
    )


async def admit(store: JobStore, settings: Settings, model: str) -> None:
    """Raise 404 for a model nobody serves, 429 (with Retry-After) when its queue is full.

    The depth check and the enqueue are separate steps, so concurrent requests across API
    replicas may overshoot the limit by as many requests as are in flight at that moment."""
    workers, depth = await store.admission_view(model)
    if not workers and model not in settings.known_models:
        raise not_found(model)
    limit = settings.queue_limit(model)
    if 0 < limit <= depth:
        raise APIError(
            429,
            f"The queue for '{model}' is full ({depth} requests waiting); retry after "
            f"{settings.retry_after_s} seconds.",
            "rate_limit_error",
            "queue_full",
            headers={"Retry-After": str(settings.retry_after_s)},
        )


def _too_many(message: str, code: str, settings: Settings) -> APIError:
    return APIError(
        429, message, "rate_limit_error", code, headers={"Retry-After": str(settings.retry_after_s)}
    )


def admit_stream(settings: Settings, owner: str, open_streams: int) -> None:
    """Raise 429 when this API key already holds MAX_STREAMS_PER_KEY open streams on this
    API process (counted per process: N replicas allow up to N times as many). Without API
    keys there is no per-key limit."""
    limit = settings.max_streams_per_key
    if owner and limit > 0 and open_streams >= limit:
        raise _too_many(
            f"Too many open streams for this API key ({open_streams}; the limit is {limit}).",
            "too_many_streams",
            settings,
        )


async def admit_job(store: JobStore, settings: Settings, owner: str) -> None:
    """Raise 429 when this API key already has MAX_JOBS_PER_KEY jobs that have not ended
    (queued or running, on any replica). Without API keys there is no per-key limit."""
    limit = settings.max_jobs_per_key
    if not owner or limit <= 0:
        return
    active = await store.unfinished(owner)
    if active >= limit:
        raise _too_many(
            f"Too many unfinished requests for this API key ({active}; the limit is {limit}).",
            "too_many_requests",
            settings,
        )
