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
