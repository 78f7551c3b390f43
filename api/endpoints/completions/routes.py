"""The legacy completions' routes: their paths. The handlers are those every endpoint that
makes jobs shares (api/endpoints/routes.py)."""

from __future__ import annotations

from starlette.routing import Route

from api.endpoints.catalog import TEXT
from api.endpoints.routes import EndpointRoutes


def routes() -> list[Route]:
    text = EndpointRoutes(TEXT)
    return [
        Route("/v1/completions", text.create, methods=["POST"]),
        Route("/v1/completions/{completion_id}", text.retrieve, methods=["GET"]),
        Route("/v1/completions/{completion_id}", text.delete, methods=["DELETE"]),
        Route("/v1/completions/{completion_id}/cancel", text.cancel, methods=["POST"]),
    ]
