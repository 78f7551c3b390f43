"""The app's routes: each public path can be found by its text, and every endpoint of the
catalog is served where the catalog says."""

from __future__ import annotations

from pathlib import Path

from starlette.routing import Route

from api.app import create_app
from api.endpoints.catalog import BY_NAME
from api.ops import ui
from api.settings import Access, Settings

API = Path(__file__).resolve().parents[3] / "api"


def _routes() -> list[Route]:
    app = create_app(Settings(access=Access(api_keys=("sesame",), ui=True)))  # no lifespan: no Redis
    return [r for r in app.routes if isinstance(r, Route)]


def test_grep_of_every_public_path_lands_on_the_line_that_routes_it():
    lines = [line for f in API.rglob("*.py") for line in f.read_text().splitlines() if "Route(" in line]
    for route in _routes():
        if route.path in ui.PATHS or route.path == "/":
            continue  # the pages are routed from their list (api/ops/ui.py)
        quoted = f'"{route.path}"'
        assert any(quoted in line for line in lines), f"{route.path} is not written out in a Route(...)"


def test_each_endpoint_of_the_catalog_is_created_by_a_post_to_its_path():
    posts = {r.path for r in _routes() if "POST" in (r.methods or ())}
    for endpoint in BY_NAME.values():
        assert endpoint.path in posts, endpoint.name
