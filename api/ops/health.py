"""Liveness and readiness probes."""

from __future__ import annotations

from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import JSONResponse

from api.services import Services


async def health(request: Request) -> JSONResponse:
    """The process is up (llama-server, vLLM and benchmark tools probe /health)."""
    return JSONResponse({"status": "ok"})


async def ready(request: Request) -> JSONResponse:
    """Redis answers (both servers, with STREAMS_REDIS_URL): this replica can accept requests."""
    services: Services = request.state.services
    try:
        for client in services.servers.each():
            await client.ping()
    except (RedisError, OSError) as exc:
        return JSONResponse({"status": "unavailable", "reason": type(exc).__name__}, status_code=503)
    return JSONResponse({"status": "ready"})
