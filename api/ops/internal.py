"""The internal listener (INTERNAL_PORT): `/metrics`, `/scaling/<model>` and the probes.

`/metrics` and `/scaling/<model>` are for Prometheus and the autoscaler inside the cluster.
This same process serves them, on its own port. Half of /metrics is this process's own
(streams open, time to first token). A separate process could not see it. The listener needs
no API key. It should be reachable from the cluster only (a NetworkPolicy in
infra/kubernetes). On the public port these routes answer operator keys only
(api/http/auth.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import uvicorn
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from api.ops import health, models, prometheus
from api.services import Services

log = logging.getLogger(__name__)

ROUTES = [
    Route("/metrics", prometheus.metrics),
    Route("/scaling/{model:path}", models.scaling),
]
PROBES = [
    Route("/health", health.health),
    Route("/healthz", health.health),
    Route("/readyz", health.ready),
]


class _WithServices:
    """Gives the internal routes the process's services, as the public app's lifespan does."""

    def __init__(self, app: ASGIApp, services: Services) -> None:
        self.app, self.services = app, services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope.setdefault("state", {})["services"] = self.services
        await self.app(scope, receive, send)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # the public server owns the process's signals; this one stops with it
        yield


class InternalServer:
    def __init__(self, services: Services, port: int, host: str, exception_handlers: dict) -> None:
        app = Starlette(routes=[*ROUTES, *PROBES], exception_handlers=exception_handlers)
        config = uvicorn.Config(
            _WithServices(app, services),
            host=host,
            port=port,
            lifespan="off",
            log_config=None,
            access_log=False,
        )
        self._server = _Server(config)
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve(), name="internal-server")
        while not self._server.started and not self._task.done():
            await asyncio.sleep(0.01)
        if self._task.done():
            # could not bind: say why, at start
            self._task.result()
        log.info("metrics and scaling on %s:%d", self._server.config.host, self._server.config.port)

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
