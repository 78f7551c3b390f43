"""The browser pages are served only with UI=1, without a key (they are static), and only
they: every API route behind them still needs one."""

from __future__ import annotations

from starlette.testclient import TestClient

from api.app import create_app
from api.ops import ui
from api.settings import Access, Settings


def app(**kw) -> TestClient:
    return TestClient(
        create_app(Settings(access=Access(api_keys=("sesame",), **kw)))
    )  # no lifespan: no Redis


def test_the_pages_and_their_files_are_served_without_a_key_when_enabled():
    client = app(ui=True)
    for path in ui.PATHS:
        resp = client.get(path)
        assert resp.status_code == 200, path
        assert "default-src 'none'" in resp.headers["content-security-policy"]
    assert "text/html" in client.get("/").headers["content-type"]
    assert "javascript" in client.get("/ui/playground.js").headers["content-type"]
    for path in ("/v1/models", "/metrics", "/ui/other.js", "/pool/x", "/ui/../ui.py"):
        assert client.get(path).status_code == 401, path


def test_without_ui_there_are_no_pages():
    client = app()
    assert client.get("/").status_code == 401  # deny by default: no route, still no key
    assert client.get("/", headers={"Authorization": "Bearer sesame"}).status_code == 404
    assert client.get("/pool", headers={"Authorization": "Bearer sesame"}).status_code == 404


def test_every_asset_the_pages_name_exists():
    named = {a for page in ui.PAGES for a in ui.ASSETS if f"/ui/{a}" in ui.render(page)}
    assert named == set(ui.ASSETS) and all((ui.DIR / a).is_file() for a in ui.ASSETS)


def test_each_page_is_the_layout_with_its_own_main_title_and_menu_mark():
    for page in ui.PAGES:
        html = ui.render(page)
        assert html.startswith("<!doctype html>") and "$" not in html
        assert f"<title>tokenspool {page.name.lower()}</title>" in html
        assert (ui.DIR / page.main).read_text() in html and f'src="/ui/{page.script}"' in html
        assert html.count('aria-current="page"') == 1
        assert f'<a href="{page.path}" aria-current="page">{page.name}</a>' in html
