"""api/http/origins.py: a server without keys answers only its own host names, and refuses a
browser's cross-site request that would change anything."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from api.http.origins import KeylessGuard, host_name


def client(hosts=("localhost", "127.0.0.1", "::1"), origins=()) -> TestClient:
    async def ok(request):
        return PlainTextResponse("ok")

    app = Starlette(
        routes=[Route("/v1/x", ok, methods=["GET", "POST"])],
        middleware=[Middleware(KeylessGuard, hosts=hosts, origins=origins)],
    )
    return TestClient(app, base_url="http://localhost:8000")


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("localhost:8000", "localhost"),
        ("LOCALHOST", "localhost"),
        ("[::1]:8000", "::1"),
        ("", None),
        ("[x", None),
    ],
)
def test_a_host_header_s_name(header, name):
    assert host_name(header) == name


def test_a_rebound_name_is_refused_and_the_server_s_own_answered():
    c = client()
    assert c.get("/v1/x").status_code == 200
    assert c.get("/v1/x", headers={"host": "attacker.example:8000"}).status_code == 400
    assert client(hosts=("*",)).get("/v1/x", headers={"host": "any.example"}).status_code == 200


def test_a_cross_site_post_is_refused_unless_its_origin_is_allowed():
    c = client()
    assert c.post("/v1/x", headers={"origin": "https://evil.example"}).status_code == 403
    assert c.post("/v1/x", headers={"sec-fetch-site": "cross-site"}).status_code == 403
    assert c.post("/v1/x", headers={"origin": "http://localhost:8000"}).status_code == 200  # its own page
    assert c.post("/v1/x").status_code == 200  # a client that is no browser
    assert c.get("/v1/x", headers={"origin": "https://evil.example"}).status_code == 200  # reads only
    allowed = client(origins=("https://app.example/",))
    assert allowed.post("/v1/x", headers={"origin": "https://APP.example"}).status_code == 200
