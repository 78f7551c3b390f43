"""The browser pages are served only with UI=1, without a key (they are static), and only
they: every API route behind them still needs one."""

from __future__ import annotations

from starlette.testclient import TestClient

from api import ui
from api.app import create_app
from api.settings import Settings


def app(**kw) -> TestClient:
    return TestClient(create_app(Settings(api_keys=("sesame",), **kw)))  # no lifespan: no Redis


def test_the_pages_and_their_files_are_served_without_a_key_when_enabled():
    client = app(ui=True)
    for path in ui.PATHS:
        resp = client.get(path)
        assert resp.status_code == 200, path
        assert "default-src 'none'" in resp.headers["content-security-policy"]
    assert "text/html" in client.get("/").headers["content-type"]
    assert "javascript" in client.get("/ui/playground.js").headers["content-type"]
    for path in ("/v1/models", "/metrics", "/ui/other.js", "/pool/x", "/ui/../api/ui.py"):
        assert client.get(path).status_code == 401, path


def test_without_ui_there_are_no_pages():
    client = app()
    assert client.get("/").status_code == 401  # deny by default: no route, still no key
    assert client.get("/", headers={"Authorization": "Bearer sesame"}).status_code == 404
    assert client.get("/pool", headers={"Authorization": "Bearer sesame"}).status_code == 404


def test_every_asset_the_pages_name_exists():
    for name in ui.PAGES.values():
        html = (ui.DIR / name).read_text()
        for asset in ui.ASSETS:
            if f"/ui/{asset}" in html:
                assert (ui.DIR / asset).is_file()
    named = {a for name in ui.PAGES.values() for a in ui.ASSETS if f"/ui/{a}" in (ui.DIR / name).read_text()}
    assert named == set(ui.ASSETS)
