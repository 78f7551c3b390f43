"""Health, readiness and the model list."""

from __future__ import annotations

from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import JSONResponse

from api import admission
from api.services import Services


async def health(request: Request) -> JSONResponse:
    """The process is up (llama-server, vLLM and benchmark tools probe /health)."""
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> JSONResponse:
    """Redis answers: this replica can accept requests."""
    services: Services = request.state.services
    try:
        await services.redis.ping()
    except (RedisError, OSError) as exc:
        return JSONResponse({"status": "unavailable", "reason": type(exc).__name__}, status_code=503)
    return JSONResponse({"status": "ready"})


def _model(name: str, workers: int) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "tokenspool", "workers": workers}


async def list_models(request: Request) -> JSONResponse:
    services: Services = request.state.services
    live = await admission.models(services.jobs, services.settings)
    return JSONResponse({"object": "list", "data": [_model(m, n) for m, n in live.items()]})


async def get_model(request: Request) -> JSONResponse:
    services: Services = request.state.services
    name = request.path_params["model"]
    live = await admission.models(services.jobs, services.settings, [name])
    if name not in live:
        raise admission.not_found(name)
    return JSONResponse(_model(name, live[name]))


async def scaling(request: Request) -> JSONResponse:
    """One model's demand, for an autoscaler (KEDA's metrics-api scaler reads `demand`):
    jobs waiting plus attempts running, i.e. how many single-job workers would be busy.
    `slots` is how many jobs the live workers can run at once (their SLOTS, summed)."""
    services: Services = request.state.services
    name = request.path_params["model"]
    served = await admission.models(services.jobs, services.settings, [name])
    queued = (await services.jobs.queue_depths([name]))[name]
    running = (await services.jobs.in_flight()).get(name, 0)
    slots = (await services.jobs.slots([name]))[name]
    if name not in served and not queued and not running:
        raise admission.not_found(name)
    return JSONResponse(
        {
            "model": name,
            "queued": queued,
            "in_flight": running,
            "workers": served.get(name, 0),
            "slots": slots,
            "demand": queued + running,
        }
    )
