"""API keys: clear or hashed, from the environment or a file that is re-read when it changes."""

from __future__ import annotations

import hashlib
import os

import pytest

from api.http.auth import APIKeyMiddleware, Grant, KeyRing, digest, key_id, parse_keys


def sha(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def test_clear_and_hashed_keys_are_both_accepted():
    ring = KeyRing(("alpha", sha("beta")))
    assert ring.owner("alpha") == digest("alpha")[:32]
    assert ring.owner("beta") == digest("beta")[:32]
    assert ring.owner("gamma") is None
    assert ring.owner(sha("beta")) is None  # the digest is not itself a key


def test_no_keys_means_no_auth():
    assert not KeyRing().enabled


@pytest.mark.parametrize("bad", ["sha256:abc", "sha256:" + "z" * 64])
def test_malformed_digests_are_skipped_and_the_rest_kept(bad, caplog):
    assert parse_keys([bad, "good"]) == parse_keys(["good"])
    assert "entry 1" in caplog.text and bad not in caplog.text  # said, never echoed


def test_key_file_rotation_without_restart(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# rotated monthly\nold-key\n")
    ring = KeyRing(path=str(path), recheck_s=0)
    assert ring.enabled and ring.owner("old-key") and ring.owner("new-key") is None
    path.write_text(f"new-key\n{sha('other')}\n")
    os.utime(path, ns=(1, 1))  # a different mtime even within the clock's resolution
    assert ring.owner("new-key") and ring.owner("other") and ring.owner("old-key") is None


def test_a_rewritten_key_file_with_a_bad_line_revokes_what_it_dropped(tmp_path):
    """Rotating keys by rewriting the file revokes the old key even if a line of the new file
    is malformed (found by the security review: the old set used to stay whole)."""
    path = tmp_path / "keys"
    path.write_text("k1\nk2\n")
    ring = KeyRing(path=str(path), recheck_s=0)
    path.write_text("sha256:nothex\nk2\n")  # k1 revoked, a typo beside it
    os.utime(path, ns=(2, 2))
    assert ring.owner("k1") is None and ring.owner("k2")


def test_a_line_that_is_not_utf8_is_skipped_like_any_bad_line(tmp_path, caplog):
    path = tmp_path / "keys"
    path.write_text("k1\nk2\n")
    ring = KeyRing(path=str(path), recheck_s=0)
    path.write_bytes(b"\xff\xfe-not-text\nk2\n")  # k1 revoked, a line of bytes beside it
    os.utime(path, ns=(3, 3))
    assert ring.owner("k1") is None and ring.owner("k2")
    assert "entry 1" in caplog.text and "\xff" not in caplog.text


def test_an_unreadable_key_file_keeps_the_last_good_keys(tmp_path):
    path = tmp_path / "keys"
    path.write_text("k1\n")
    ring = KeyRing(path=str(path), recheck_s=0)
    path.unlink()
    assert ring.owner("k1")


def test_an_empty_key_file_accepts_nobody(tmp_path):
    path = tmp_path / "keys"
    path.write_text("")
    ring = KeyRing(path=str(path), recheck_s=0)
    assert ring.enabled and ring.owner("") is None and ring.owner("x") is None


def _app(keys: KeyRing):
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def ok(request):
        return PlainTextResponse("ok")

    routes = [Route(p, ok) for p in ("/v1/models", "/metrics", "/scaling/m", "/openapi.json", "/healthz")]
    return APIKeyMiddleware(Starlette(routes=routes), keys)


@pytest.mark.parametrize("root_path", ["", "/api", "/tokenspool/v2"])
@pytest.mark.parametrize("path", ["/v1/models", "/metrics", "/scaling/m", "/openapi.json"])
def test_every_route_needs_a_key_behind_any_root_path(root_path, path):
    """Deny by default, judged on the path the router matches: behind --root-path or a mount
    the key check used to see /api/v1/... and let it through (the security review)."""
    import asyncio

    import httpx

    async def get(headers: dict) -> int:
        transport = httpx.ASGITransport(app=_app(KeyRing(operators=("k",))), root_path=root_path)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return (await client.get(root_path + path, headers=headers)).status_code

    assert asyncio.run(get({})) == 401
    assert asyncio.run(get({"Authorization": "Bearer k"})) == 200
    assert asyncio.run(get({"x-api-key": "k"})) == 200  # as Anthropic's SDKs send it
    assert asyncio.run(get({"x-api-key": "j"})) == 401


def test_the_probes_alone_need_no_key():
    import asyncio

    import httpx

    async def get(path: str) -> int:
        transport = httpx.ASGITransport(app=_app(KeyRing(("k",))))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return (await client.get(path)).status_code

    assert asyncio.run(get("/healthz")) == 200
    assert asyncio.run(get("/healthz/../v1/models")) == 401


def test_a_key_line_names_its_role_and_tiers(tmp_path, caplog):
    path = tmp_path / "keys"
    path.write_text(
        "ops-key role=operator\nslow-key tiers=default,flex requests_per_minute=6\n"
        "plain-key\nbad-key role=god\n"
    )
    ring = KeyRing(path=str(path), recheck_s=0, operators=("env-op",))
    assert ring.grant("ops-key")[1] == Grant(role="operator")  # type: ignore[index]
    assert ring.grant("env-op")[1].operator  # type: ignore[index]
    slow = ring.grant("slow-key")[1]  # type: ignore[index]
    assert not slow.operator and slow.tiers == {"default", "flex"} and slow.requests_per_minute == 6
    assert slow.bytes_per_minute is None  # KEY_BYTES_PER_MINUTE's
    assert ring.grant("plain-key")[1] == Grant()  # type: ignore[index]  # a tenant of every tier
    assert ring.grant("bad-key") is None and "entry 4" in caplog.text and "god" not in caplog.text


def test_the_pool_wide_routes_answer_operators_only():
    import asyncio

    import httpx

    async def get(path: str, key: str) -> int:
        app = _app(KeyRing(("tenant",), operators=("op",)))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return (await client.get(path, headers={"Authorization": f"Bearer {key}"})).status_code

    assert asyncio.run(get("/metrics", "tenant")) == 403
    assert asyncio.run(get("/scaling/m", "tenant")) == 403
    assert asyncio.run(get("/metrics", "op")) == 200
    assert asyncio.run(get("/v1/models", "tenant")) == 200


def test_metrics_name_the_first_keys_configured_by_id_and_sum_the_rest(tmp_path):
    """/metrics shows a key's budget use by its key id, never the key, and stays bounded: past
    METRICS_KEYS keys, the rest are one `other` series."""
    path = tmp_path / "keys"
    path.write_text("sk-file-one tokens_per_minute=500\nsk-env-two requests_per_minute=9\n")
    ring = KeyRing(("sk-env-one", "sk-env-two"), str(path), recheck_s=0)
    owners = ring.owners()
    one, two, file_one = (digest(k)[:32] for k in ("sk-env-one", "sk-env-two", "sk-file-one"))
    assert [o for o, _ in owners] == [one, two, file_one]  # the environment's, then the file's
    assert dict(owners)[two].requests_per_minute == 9  # a key in both: the file's grant
    assert [ring.label(o, 2) for o in (one, two, file_one)] == [one[:12], two[:12], "other"]
    assert ring.label(digest("sk-unknown")[:32], 2) == "other"
    assert key_id(one) == digest("sk-env-one")[:12] and "sk-env-one" not in key_id(one)

    path.write_text("sk-file-new\n")  # rotated: its places follow
    os.utime(path, ns=(1, 1))
    assert [o for o, _ in ring.owners()] == [one, two, digest("sk-file-new")[:32]]
    assert ring.label(file_one, 100) == "other"  # revoked: no series of its own any more
