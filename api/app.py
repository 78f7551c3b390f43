"""The Starlette application, composed explicitly: routes, middleware, error handlers.

`create_app(settings)` builds one; uvicorn serves it as a factory
(`uvicorn --factory api.app:create_app`, settings from the environment). Per-process state
(Redis clients, the stream hub) lives in the lifespan state, never in module globals.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from api import completions, meta, metrics, openapi
from api.auth import APIKeyMiddleware, KeyRing
from api.errors import APIError, error_body
from api.services import Services
from api.settings import Settings
from contract import logs

log = logging.getLogger("tokenspool.api")


def _rejected(request: Request, reason: str) -> None:
    services = request.scope.get("state", {}).get("services")
    if services is not None:
        services.metrics.rejected.labels(reason).inc()


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    _rejected(request, exc.code or str(exc.status))
    return exc.response()


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    _rejected(request, code or str(exc.status_code))
    return JSONResponse(
        error_body(str(exc.detail), "invalid_request_error", code, None),
        status_code=exc.status_code,
        headers=exc.headers,
    )


async def _redis_error(request: Request, exc: Exception) -> JSONResponse:
    log.warning("Redis unavailable: %s", exc)
    _rejected(request, "service_unavailable")
    return JSONResponse(
        error_body(
            "The queue is unavailable; try again shortly.", "server_error", "service_unavailable", None
        ),
        status_code=503,
        headers={"Retry-After": "1"},
    )


async def _server_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return JSONResponse(
        error_body("Internal server error.", "server_error", "internal_error", None), status_code=500
    )


def _middleware(settings: Settings) -> list[Middleware]:
    """CORS (only for the configured origins; off by default) wraps the key check, so a
    browser's preflight is answered without a key."""
    out = []
    if settings.cors_origins:
        out.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(settings.cors_origins),
                allow_methods=["GET", "POST", "DELETE"],
                allow_headers=["Authorization", "Content-Type", "Last-Event-ID", "Prefer"],
                max_age=600,
            )
        )
    out.append(Middleware(APIKeyMiddleware, keys=KeyRing(settings.api_keys, settings.api_keys_file)))
    return out


def create_app(settings: Settings | None = None) -> Starlette:
    settings = settings or Settings.from_env()
    logs.configure("api")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict]:
        services = await Services.start(settings)
        try:
            yield {"services": services}
        finally:
            await services.close()

    routes = [
        Route("/health", meta.health),
        Route("/healthz", meta.health),
        Route("/readyz", meta.ready),
        Route("/metrics", metrics.metrics),
        Route("/openapi.json", openapi.openapi),
        Route("/scaling/{model:path}", meta.scaling),
        Route("/v1/models", meta.list_models),
        Route("/v1/models/{model:path}", meta.get_model),
        Route("/v1/chat/completions", completions.chat_completions, methods=["POST"]),
        Route("/v1/completions", completions.completions, methods=["POST"]),
        Route("/v1/chat/completions/{completion_id}", completions.retrieve_chat, methods=["GET"]),
        Route("/v1/completions/{completion_id}", completions.retrieve_completion, methods=["GET"]),
        Route("/v1/chat/completions/{completion_id}", completions.delete_chat, methods=["DELETE"]),
        Route("/v1/completions/{completion_id}", completions.delete_completion, methods=["DELETE"]),
        Route("/v1/chat/completions/{completion_id}/cancel", completions.cancel_chat, methods=["POST"]),
        Route("/v1/completions/{completion_id}/cancel", completions.cancel_completion, methods=["POST"]),
    ]
    return Starlette(
        routes=routes,
        middleware=_middleware(settings),
        exception_handlers={
            APIError: _api_error,
            HTTPException: _http_error,
            RedisError: _redis_error,
            ConnectionError: _redis_error,
            Exception: _server_error,
        },
        lifespan=lifespan,
    )
