"""Optional API keys: `Authorization: Bearer <key>` on every /v1 route.

Keys are compared in constant time against every configured key (no early exit), and are
never logged or echoed. The request's `owner` (a hash of its key, "" without keys) is what
a job records as its creator: only the same key may resume, fetch or cancel it.
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from api.errors import APIError


def owner_of(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def key_matches(presented: str, accepted: tuple[str, ...]) -> bool:
    given = presented.encode()
    ok = False
    for key in accepted:
        ok |= hmac.compare_digest(given, key.encode())
    return ok


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, keys: tuple[str, ...]) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        if not header:
            error = APIError(
                401,
                "You didn't provide an API key. Provide it in the Authorization header as 'Bearer YOUR_KEY'.",
                code="missing_api_key",
            )
        elif scheme.lower() != "bearer" or not key_matches(token.strip(), self.keys):
            error = APIError(401, "Incorrect API key provided.", code="invalid_api_key")
        else:
            scope.setdefault("state", {})["owner"] = owner_of(token.strip())
            await self.app(scope, receive, send)
            return
        error.headers = {"WWW-Authenticate": "Bearer"}
        services = scope.get("state", {}).get("services")
        if services is not None:
            services.metrics.rejected.labels(error.code).inc()
        await error.response()(scope, receive, send)
