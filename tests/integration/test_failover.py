"""Failovers, where a replica is promoted. Through Redis Sentinel
(`REDIS_URL=redis+sentinel://...`): the primary is SIGKILLed while a stream runs and a
background job waits, the sentinels promote its replica, and the same API and worker
processes carry on with the new primary; the old primary comes back as a replica and a
second failover (nothing held back) moves them again. Behind one name (a managed Redis: a
relay stands for its DNS name), the primary is demoted under open connections, which then
meet READONLY, and the name is repointed at the promoted replica. The replica has caught up
each time: a promoted replica that lacks the last writes is not handled yet."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from devstack.processes import (
    Proc,
    Watched,
    start_api,
    start_redis,
    start_watched,
    start_worker,
    wait_for_model,
)
from devstack.relay import Relay
from tests.integration.conftest import MODEL
from tests.integration.test_outage import STORY, Reader
from tests.sse_contract import check_stream

pytestmark = pytest.mark.integration

API_ENV = {"KEEPALIVE_SECONDS": "0.5", "CANCEL_GRACE_SECONDS": "60"}
WORKER_ENV = {"SLOTS": "2", "HEARTBEAT_WINDOW_SECONDS": "2", "REDIS_WAIT_SECONDS": "60"}


@dataclass
class Stack:
    logs: Path
    watched: Watched
    base: str
    api: Proc
    worker: Proc

    def sentinel(self) -> redis.Redis:
        port = int(self.watched.url.split("//", 1)[1].split(",", 1)[0].rsplit(":", 1)[1])
        return redis.Redis(port=port, socket_timeout=5)

    def primary_port(self) -> int:
        return int(self.sentinel().sentinel_get_master_addr_by_name("tokenspool")[1])

    def wait_for_primary(self, port: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.primary_port() != port:
            assert time.monotonic() < deadline, "the sentinels did not promote the replica"
            time.sleep(0.1)


@pytest.fixture
def stack(tmp_path) -> Iterator[Stack]:
    watched = start_watched(tmp_path)
    api, base = start_api(tmp_path, watched.url, env=API_ENV)
    worker = start_worker(tmp_path, watched.url, name="w", env=WORKER_ENV)
    s = Stack(tmp_path, watched, base, api, worker)
    try:
        wait_for_model(base, MODEL, procs=(api, worker))
        yield s
    finally:
        for p in (worker, api, *watched.procs()):
            p.stop()


def ask(base: str, **extra) -> httpx.Response:
    body = {"model": MODEL, "messages": [STORY], "max_tokens": 8, "temperature": 0, **extra}
    return httpx.post(base + "/v1/chat/completions", json=body, timeout=120)


def answer(base: str) -> str:
    r = ask(base)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def background_answer(base: str, cid: str) -> dict:
    deadline = time.monotonic() + 90
    while True:
        r = httpx.get(f"{base}/v1/chat/completions/{cid}", timeout=30)
        if r.status_code == 200 or time.monotonic() > deadline:
            return r.json()
        time.sleep(0.2)


def test_api_and_worker_follow_the_new_primary_through_two_failovers(stack):
    s, w = stack, stack.watched
    pids = (s.api.pid, s.worker.pid)
    busy = Reader(
        s.base,
        {"model": MODEL, "messages": [STORY], "max_tokens": 120, "temperature": 0, "stream": True},
    )
    busy.start()
    assert busy.chunks.acquire(timeout=60), busy.raw  # the worker is generating
    waiting = ask(s.base, background=True).json()["id"]
    with redis.Redis(port=w.ports["primary"], socket_timeout=5) as r:
        assert r.wait(1, 5000) == 1  # the replica has every write so far (a lagging one: issue 41)
    w.primary.signal(signal.SIGKILL)
    w.primary.popen.wait()
    s.wait_for_primary(w.ports["replica"])
    busy.join(timeout=120)
    assert not busy.is_alive()
    parsed = check_stream(busy.raw, "chat")  # ends whole, with [DONE]
    assert parsed.error is None and parsed.finish_reason in ("stop", "length"), busy.raw[-600:]
    replay = httpx.get(f"{s.base}/v1/chat/completions/{busy.cid}", timeout=30).json()
    assert replay["choices"][0]["message"]["content"] == parsed.text  # the new primary has it all
    assert background_answer(s.base, waiting)["choices"][0]["message"]["content"]
    assert answer(s.base)

    # The old primary comes back: the sentinels make it a replica. A failover asked of them
    # (an upgrade, a planned move) makes it the primary again.
    old, _ = start_redis(s.logs, port=w.ports["primary"])
    w.primary = old
    with redis.Redis(port=w.ports["primary"], socket_timeout=5) as r:
        deadline = time.monotonic() + 30
        while r.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the old primary did not become a replica"
            time.sleep(0.2)
    s.sentinel().execute_command("SENTINEL", "FAILOVER", "tokenspool")
    s.wait_for_primary(w.ports["primary"])
    for _ in range(3):
        assert answer(s.base)
    assert ask(s.base, background=True).status_code == 202
    assert (s.api.pid, s.worker.pid) == pids and s.api.alive() and s.worker.alive()
    assert s.worker.log().count('"loading ') == 1  # the model loaded once


def test_behind_one_name_a_demoted_primary_s_readonly_sends_everyone_to_the_new_one(tmp_path):
    primary, primary_url = start_redis(tmp_path)
    p_port = int(primary_url.rsplit(":", 1)[1].split("/")[0])
    replica, replica_url = start_redis(tmp_path, extra=("--replicaof", "127.0.0.1", str(p_port)))
    r_port = int(replica_url.rsplit(":", 1)[1].split("/")[0])
    name = Relay(p_port)  # the endpoint's DNS name
    url = f"redis://127.0.0.1:{name.port}/0"
    api, base = start_api(tmp_path, url, env=API_ENV)
    worker = start_worker(tmp_path, url, name="w", env=WORKER_ENV)
    try:
        wait_for_model(base, MODEL, procs=(api, worker))
        with redis.Redis(port=r_port, socket_timeout=5) as r:
            deadline = time.monotonic() + 30
            while r.info("replication").get("master_link_status") != "up":
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert answer(base)  # every process has connected
        busy = Reader(
            base, {"model": MODEL, "messages": [STORY], "max_tokens": 120, "temperature": 0, "stream": True}
        )
        busy.start()
        assert busy.chunks.acquire(timeout=60), busy.raw
        # The managed failover: the replica is promoted, the old primary follows it, and the
        # name moves; connections opened before stay with the old primary until they fail.
        with (
            redis.Redis(port=p_port, socket_timeout=5) as old,
            redis.Redis(port=r_port, socket_timeout=5) as new,
        ):
            assert old.wait(1, 5000) == 1
            new.replicaof("NO", "ONE")
            old.replicaof("127.0.0.1", r_port)
        name.retarget(r_port)
        busy.join(timeout=120)
        assert not busy.is_alive()
        parsed = check_stream(busy.raw, "chat")
        assert parsed.error is None and parsed.finish_reason in ("stop", "length"), busy.raw[-600:]
        replay = httpx.get(f"{base}/v1/chat/completions/{busy.cid}", timeout=30).json()
        assert replay["choices"][0]["message"]["content"] == parsed.text
        for _ in range(3):
            assert answer(base)
        assert ask(base, background=True).status_code == 202
        assert api.alive() and worker.alive() and worker.log().count('"loading ') == 1
    finally:
        name.close()
        for p in (worker, api, primary, replica):
            p.stop()
