"""api/ops/key_metrics.py: each key's budget use this minute, by key id (never the key), its
limits, and the keys past METRICS_KEYS summed under `key="other"`, read from fakeredis."""

from __future__ import annotations

import asyncio
import hashlib
from types import SimpleNamespace

import fakeredis
import pytest

from api.http.auth import KeyRing
from api.jobs.admission import Admission, OpenStreams
from api.jobs.memory import MemoryWatch
from api.jobs.workers import WorkerRegistry
from api.ops import key_metrics
from api.settings import Access, Intake, Quotas, Settings
from contract import keys

MINUTE = 29_000_000  # the minute the scrape is in
USED, LIMIT = "tokenspool_key_budget_used", "tokenspool_key_budget_limit"
QUOTAS = Quotas(key_requests_per_minute=600, key_bytes_per_minute=5_000, key_tokens_per_minute=0)


@pytest.fixture(autouse=True)
def this_minute(monkeypatch) -> None:
    """The scrape's minute, fixed: a test is never split across a minute's end."""
    monkeypatch.setattr(key_metrics, "this_minute", lambda: MINUTE)


def owner(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def scrape(ring: KeyRing, counters: dict[str, int] | None = None, shown: int = 100) -> dict:
    """(metric name, key, budget) -> value, after `counters` (Redis key -> count) are set."""
    r = fakeredis.FakeAsyncRedis()
    memory = MemoryWatch(r, 0.9)
    svc = SimpleNamespace(
        keys=ring,
        redis=r,
        settings=Settings(access=Access(metrics_keys=shown)),
        admission=Admission(r, WorkerRegistry(r, 15.0), OpenStreams(), memory, Intake(), QUOTAS),
    )

    async def go() -> list:
        for key, value in (counters or {}).items():
            await r.set(key, value)
        return await key_metrics.budget_use(svc)

    families = asyncio.run(go())
    assert [f.name for f in families] == [USED, LIMIT]
    return {(s.name, s.labels["key"], s.labels["budget"]): s.value for f in families for s in f.samples}


def test_without_keys_there_are_no_series():
    assert scrape(KeyRing(())) == {}


def test_a_key_s_use_is_this_minute_s_counters_and_its_limits_the_defaults():
    a = owner("key-a")
    got = scrape(
        KeyRing(("key-a",)),
        {
            keys.requests_per_minute(a, MINUTE): 3,
            keys.bytes_per_minute(a, MINUTE): 1200,
            keys.tokens_per_minute(a, MINUTE - 1): 999,  # last minute's: not this one's
            keys.requests_per_minute(a, MINUTE - 1): 50,
        },
    )
    ka = a[:12]
    assert got == {
        (USED, ka, "requests"): 3,
        (USED, ka, "bytes"): 1200,
        (USED, ka, "tokens"): 0,
        (LIMIT, ka, "requests"): 600,
        (LIMIT, ka, "bytes"): 5_000,
        (LIMIT, ka, "tokens"): 0,
    }


def test_a_key_is_shown_by_its_id_never_by_the_key():
    got = scrape(KeyRing(("sk-very-secret",), operators=("op-secret",)))
    labels = {key for _, key, _ in got}
    assert labels == {owner("sk-very-secret")[:12], owner("op-secret")[:12]}
    assert all(len(label) == 12 and "secret" not in label for label in labels)


def test_a_key_s_own_budgets_from_the_keys_file_are_its_limits(tmp_path):
    path = tmp_path / "keys"
    path.write_text("key-own requests_per_minute=60 tokens_per_minute=30000 bytes_per_minute=0\nkey-plain\n")
    got = scrape(KeyRing((), str(path)))
    own, plain = owner("key-own")[:12], owner("key-plain")[:12]
    assert [got[(LIMIT, own, b)] for b in ("requests", "bytes", "tokens")] == [60, 0, 30_000]
    assert [got[(LIMIT, plain, b)] for b in ("requests", "bytes", "tokens")] == [600, 5_000, 0]


def test_the_keys_past_metrics_keys_are_summed_under_other_in_the_order_configured():
    ring = KeyRing(("k1", "k2", "k3", "k4"))
    counters = {
        keys.requests_per_minute(owner(k), MINUTE): n for n, k in enumerate(("k1", "k2", "k3", "k4"), 1)
    }
    counters[keys.tokens_per_minute(owner("k4"), MINUTE)] = 70
    got = scrape(ring, counters, shown=2)
    assert {key for _, key, _ in got} == {owner("k1")[:12], owner("k2")[:12], "other"}
    assert got[(USED, owner("k1")[:12], "requests")] == 1
    assert got[(USED, owner("k2")[:12], "requests")] == 2
    assert (got[(USED, "other", "requests")], got[(USED, "other", "tokens")]) == (3 + 4, 70)
    assert got[(USED, "other", "bytes")] == 0
    assert not any(name == LIMIT and key == "other" for name, key, _ in got)  # "other" has no one limit


def test_there_is_no_other_series_while_every_key_has_its_own():
    got = scrape(KeyRing(("k1", "k2")), shown=2)
    assert {key for _, key, _ in got} == {owner("k1")[:12], owner("k2")[:12]}
    only_other = scrape(KeyRing(("k1", "k2")), {keys.bytes_per_minute(owner("k2"), MINUTE): 9}, shown=0)
    assert only_other == {
        (USED, "other", "requests"): 0,
        (USED, "other", "bytes"): 9,
        (USED, "other", "tokens"): 0,
    }
