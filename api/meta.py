"""Health, readiness and the model list."""

from __future__ import annotations

from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import JSONResponse

from api.errors import APIError
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
    live = await services.jobs.live_models()
    return JSONResponse({"object": "list", "data": [_model(m, n) for m, n in live.items()]})


async def get_model(request: Request) -> JSONResponse:
    services: Services = request.state.services
    name = request.path_params["model"]
    live = await services.jobs.live_models([name])
    if name not in live:
        raise APIError(
            404,
            f"The model '{name}' does not exist or no worker serves it.",
            code="model_not_found",
            param="model",
        )
    return JSONResponse(_model(name, live[name]))
