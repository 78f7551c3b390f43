"""The browser pages: the playground (`/`) and the pool view (`/pool`), served when UI=1.

They are static files from api/ops/pages/: plain HTML, CSS and JavaScript. There is no build
step, and nothing is fetched from elsewhere. The pages hold no data. They are served without
a key. Their scripts call the API with the key the user types, kept in the tab's
sessionStorage. A strict Content-Security-Policy lets them load only their own files and
talk only to this origin.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from string import Template

from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, Response
from starlette.routing import Route

DIR = Path(__file__).parent / "pages"


@dataclass(frozen=True)
class Page:
    """One page: its path, the name its title and menu give it, its `<main>` and its script.
    The `<main>` is a file in api/ops/pages/. It is set into layout.html with the header every
    page shares."""

    path: str
    name: str
    main: str
    script: str


PAGES = (
    Page("/", "Playground", "playground.html", "playground.js"),
    Page("/pool", "Pool", "pool.html", "pool.js"),
)
ASSETS = ("ui.css", "common.js", *(page.script for page in PAGES))
PATHS = frozenset(page.path for page in PAGES) | {f"/ui/{name}" for name in ASSETS}
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


def render(page: Page) -> str:
    """The page's HTML: the shared layout with its title, menu, `<main>` and script."""
    current = ' aria-current="page"'
    nav = " ".join(f'<a href="{p.path}"{current if p == page else ""}>{p.name}</a>' for p in PAGES)
    layout = Template((DIR / "layout.html").read_text())
    return layout.substitute(
        title=page.name.lower(), nav=nav, main=(DIR / page.main).read_text(), script=page.script
    )


def _page(page: Page) -> Callable[[Request], Awaitable[Response]]:
    # once, when the routes are made
    html = render(page)

    async def serve(request: Request) -> Response:
        return HTMLResponse(html, headers=HEADERS)

    return serve


def _asset(name: str) -> Callable[[Request], Awaitable[Response]]:
    async def serve(request: Request) -> Response:
        return FileResponse(DIR / name, headers=HEADERS)

    return serve


def routes() -> list[Route]:
    return [Route(page.path, _page(page), methods=["GET"]) for page in PAGES] + [
        Route(f"/ui/{name}", _asset(name), methods=["GET"]) for name in ASSETS
    ]
