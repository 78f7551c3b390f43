"""Chat's routes: its paths. The handlers are those every endpoint that makes jobs shares
(api/endpoints/routes.py)."""

from __future__ import annotations

from starlette.routing import Route

from api.endpoints.catalog import CHAT
from api.endpoints.routes import EndpointRoutes


def routes() -> list[Route]:
    chat = EndpointRoutes(CHAT)
    return [
        Route("/v1/chat/completions", chat.create, methods=["POST"]),
        Route("/v1/chat/completions/{completion_id}", chat.retrieve, methods=["GET"]),
        Route("/v1/chat/completions/{completion_id}", chat.delete, methods=["DELETE"]),
        Route("/v1/chat/completions/{completion_id}/cancel", chat.cancel, methods=["POST"]),
    ]
