"""The browser pages: the playground (`/`) and the pool view (`/pool`), served when UI=1.

Static files from api/ui/ (plain HTML, CSS and JavaScript, no build step, nothing fetched
from elsewhere). The pages hold no data: they are served without a key, and their scripts
call the API with the key the user types, kept in the tab's sessionStorage. A strict
Content-Security-Policy lets them load only their own files and talk only to this origin.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route

DIR = Path(__file__).parent / "ui"
PAGES = {"/": "playground.html", "/pool": "pool.html"}
ASSETS = ("ui.css", "common.js", "playground.js", "pool.js")
PATHS = frozenset(PAGES) | {f"/ui/{name}" for name in ASSETS}
"""Every path the pages use: the key check lets them through (they are static)."""

HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _file(name: str) -> Callable[[Request], Awaitable[Response]]:
    async def serve(request: Request) -> Response:
        return FileResponse(DIR / name, headers=HEADERS)

    return serve


def routes() -> list[Route]:
    return [Route(path, _file(name), methods=["GET"]) for path, name in PAGES.items()] + [
        Route(f"/ui/{name}", _file(name), methods=["GET"]) for name in ASSETS
    ]
