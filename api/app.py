"""The Starlette application, composed explicitly: routes, middleware, error handlers.

`create_app(settings)` builds one. Uvicorn serves it as a factory
(`uvicorn --factory api.app:create_app`), with settings from the environment. Per-process
state (Redis clients, the stream reader) lives in the lifespan state, never in module globals.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import anyio
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from api.batches import files
from api.batches import routes as batches
from api.batches.driver import BatchDriver
from api.endpoints.chat import routes as chat
from api.endpoints.completions import routes as completions
from api.endpoints.embeddings import routes as embeddings
from api.endpoints.messages import routes as messages
from api.endpoints.rerank import routes as rerank
from api.endpoints.responses import routes as responses
from api.http import tracing
from api.http.auth import PUBLIC_PATHS, APIKeyMiddleware, KeyRing
from api.http.errors import APIError
from api.http.origins import KeylessGuard
from api.ops import internal as internal_routes
from api.ops import models, openapi, ui
from api.ops.internal import InternalServer
from api.services import Services
from api.settings import Settings
from contract import errors, logs
from contract.settings import SettingError

log = logging.getLogger(__name__)


def _rejected(request: Request, reason: str) -> None:
    state = request.scope.get("state", {})
    if (services := state.get("services")) is not None:
        services.refused(reason, state.get("owner", ""))


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    _rejected(request, exc.code or str(exc.status))
    return exc.response(request.scope)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own 404 (no route) and 405 (wrong method), in the endpoint's error shape."""
    assert isinstance(exc, HTTPException)
    known = {404: errors.NOT_FOUND, 405: errors.METHOD_NOT_ALLOWED}.get(exc.status_code)
    code = known.code if known else None
    _rejected(request, code or str(exc.status_code))
    error = known or errors.ErrorCode(None, errors.INVALID_REQUEST_ERROR, exc.status_code)
    return APIError(error, str(exc.detail), headers=exc.headers).response(request.scope)


async def _redis_error(request: Request, exc: Exception) -> JSONResponse:
    log.warning("Redis unavailable: %s", exc)
    _rejected(request, errors.UNAVAILABLE.code or "")
    return APIError(errors.UNAVAILABLE, headers={"Retry-After": "1"}).response(request.scope)


async def _server_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return APIError(errors.INTERNAL).response(request.scope)


CORS_HEADERS = [
    "Authorization",
    "Content-Type",
    "Last-Event-ID",
    "Prefer",
    "Idempotency-Key",
    # the Anthropic SDKs send these three
    "x-api-key",
    "anthropic-version",
    "anthropic-beta",
]


def _middleware(settings: Settings, keys: KeyRing) -> list[Middleware]:
    """Outermost first. Tracing: a request's span lasts until its response's last byte
    (api/http/tracing.py). On a server without keys, the check of who may call it
    (api/http/origins.py). CORS, only for the configured origins (off by default). It is
    around the key check, so that a browser's preflight is answered without a key. Last, the
    key check."""
    access = settings.access
    traced = [Middleware(cls, **options) for cls, options in tracing.middleware()]
    guard = Middleware(KeylessGuard, hosts=access.allowed_hosts, origins=access.cors_origins)
    cors = Middleware(
        CORSMiddleware,
        allow_origins=list(access.cors_origins),
        allow_methods=["GET", "POST", "DELETE"],
        allow_headers=CORS_HEADERS,
        max_age=600,
    )
    public = PUBLIC_PATHS | (ui.PATHS if access.ui else frozenset())
    return [
        *traced,
        *([] if keys.enabled else [guard]),
        *([cors] if access.cors_origins else []),
        Middleware(APIKeyMiddleware, keys=keys, public=public),
    ]


EXCEPTION_HANDLERS = {
    APIError: _api_error,
    HTTPException: _http_error,
    RedisError: _redis_error,
    ConnectionError: _redis_error,
    Exception: _server_error,
}


def create_app(settings: Settings | None = None) -> Starlette:
    settings = settings or Settings.from_env()
    logs.configure("api", settings.shared)
    access = settings.access
    if not (access.api_keys or access.api_keys_file or access.operator_keys or access.allow_no_auth):
        raise SettingError(
            "No API keys: set API_KEYS or API_KEYS_FILE, or ALLOW_NO_AUTH=1 for a private server "
            "(the local run sets it)"
        )
    keys = KeyRing(access.api_keys, access.api_keys_file, operators=access.operator_keys)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict]:
        # anyio imports its asyncio backend at first use: now, not in a request
        await anyio.sleep(0)
        # stopped last started first, on any exit
        async with contextlib.AsyncExitStack() as parts:
            services = await Services.start(settings, keys)
            parts.push_async_callback(services.close)
            if access.internal_port:
                where = (access.internal_port, access.internal_host)
                internal = InternalServer(services, *where, EXCEPTION_HANDLERS)
                await internal.start()
                parts.push_async_callback(internal.stop)
            driver = BatchDriver(services)
            driver.start()
            parts.push_async_callback(driver.stop)
            yield {"services": services}

    routes = [
        *internal_routes.PROBES,
        Route("/openapi.json", openapi.openapi),
        Route("/v1/models", models.list_models),
        Route("/v1/models/{model:path}", models.get_model),
    ]
    # to operator keys here (api/http/auth.py), to anyone inside on INTERNAL_PORT
    routes += internal_routes.ROUTES
    for endpoint in (chat, completions, responses, messages, embeddings, rerank):
        routes += endpoint.routes()
    routes += files.ROUTES + batches.ROUTES
    if settings.access.ui:
        routes += ui.routes()
    return Starlette(
        routes=routes,
        middleware=_middleware(settings, keys),
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=lifespan,
    )
