"""Who may reach a server that needs no API key (ALLOW_NO_AUTH=1). Such a server is the
local run, or a private one. It answers its own host names, and its own pages or clients
that are not browsers.

With keys, a web page cannot act for the key's owner. A browser never adds the
`Authorization` header by itself. Without keys, any page the owner visits could. A
cross-site form post or a `text/plain` fetch needs no CORS preflight. DNS rebinding makes a
page of another site's name read the server's answers. So a keyless server answers only the
Host names of ALLOWED_HOSTS. Rebinding brings the attacker's name. The server also refuses a
request that changes anything when a browser says it comes from another site. The browser
says so in `Origin` or `Sec-Fetch-Site`. An origin in CORS_ORIGINS is let through. JSON
bodies must also be sent as `application/json` (api/endpoints/routes.py). A page can only do
that cross-site after a preflight, which fails.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from api.http.errors import APIError
from contract import errors

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def host_name(host: str) -> str | None:
    """The name of a Host header (`name`, `name:port`, `[v6]:port`), lower-cased. None if it
    does not parse."""
    try:
        name = urlsplit("//" + host).hostname
    except ValueError:
        return None
    return name.lower() if name else None


class KeylessGuard:
    """The checks above, for a server without keys (the app adds it only then)."""

    def __init__(self, app: ASGIApp, hosts: tuple[str, ...], origins: tuple[str, ...]) -> None:
        self.app = app
        self.any_host = "*" in hosts
        self.hosts = frozenset(h.strip("[]").lower() for h in hosts)
        self.origins = frozenset(o.rstrip("/").lower() for o in origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        if not self.any_host and host_name(host) not in self.hosts:
            await APIError(errors.UNKNOWN_HOST).response(scope)(scope, receive, send)
            return
        if scope["method"] not in SAFE_METHODS and self._cross_site(headers, host):
            await APIError(errors.CROSS_SITE).response(scope)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _cross_site(self, headers: dict[str, str], host: str) -> bool:
        origin = headers.get("origin")
        # browsers send it with every POST and DELETE
        if origin is not None:
            if origin.lower() in self.origins:
                return False
            parts = urlsplit(origin)
            return parts.scheme not in ("http", "https") or parts.netloc.lower() != host.lower()
        return headers.get("sec-fetch-site") == "cross-site"
