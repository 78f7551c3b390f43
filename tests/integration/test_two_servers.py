"""Queues and streams on two Redis servers (STREAMS_REDIS_URL), the streams server a plain
server or a 3-primary valkey cluster (each primary with a replica): every key lands on its
own server, streams, resumes and worker crashes work as on one server, and losing the queues
server, the streams server or a cluster primary ends or continues the streams in flight
properly, never hangs them."""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from contract import keys
from contract.servers import sync_client
from devstack.cluster import start_cluster
from devstack.peek import job_ids, running_ids
from devstack.processes import Proc, start_api, start_redis, start_worker, wait_for_model
from devstack.sse_contract import check_stream, split_events
from tests.integration.conftest import MODEL, strict_sdk
from tests.integration.test_outage import STORY, Reader

pytestmark = pytest.mark.integration

WORKER_ENV = {"SLOTS": "2", "HEARTBEAT_WINDOW_SECONDS": "2", "REDIS_WAIT_SECONDS": "60"}
API_ENV = {"KEEPALIVE_SECONDS": "0.5", "CANCEL_GRACE_SECONDS": "60", "REAPER_SETTLE_SECONDS": "3"}


@dataclass
class Split:
    logs: Path
    queues: Proc
    queues_url: str
    streams: list[Proc]  # one server, or the cluster's nodes (primaries first)
    streams_url: str
    api: Proc
    base: str
    workers: list[Proc]

    @property
    def env(self) -> dict[str, str]:
        return {"STREAMS_REDIS_URL": self.streams_url}

    def worker(self, name: str) -> Proc:
        p = start_worker(self.logs, self.queues_url, name=name, env={**WORKER_ENV, **self.env})
        self.workers.append(p)
        return p

    def q(self) -> redis.Redis:
        return redis.Redis.from_url(self.queues_url, socket_timeout=5)

    def s(self) -> redis.Redis:
        return sync_client(self.streams_url, socket_timeout=5)

    @property
    def cluster(self) -> bool:
        return len(self.streams) > 1

    def restart_queues(self) -> None:
        """Kill the queues server (SIGKILL, no persistence) and start it again on its port."""
        self.queues.signal(signal.SIGKILL)
        port = int(self.queues_url.rsplit(":", 1)[1].split("/")[0])
        time.sleep(2)
        self.queues, _ = start_redis(self.logs, port=port)


@pytest.fixture(params=["server", "cluster"])
def split(request, tmp_path):
    queues, queues_url = start_redis(tmp_path)
    if request.param == "cluster":
        streams, streams_url = start_cluster(tmp_path, masters=3, replicas=1)
    else:
        server, streams_url = start_redis(tmp_path)
        streams = [server]
    env = {**API_ENV, "STREAMS_REDIS_URL": streams_url}
    api, base = start_api(tmp_path, queues_url, env=env)
    s = Split(tmp_path, queues, queues_url, streams, streams_url, api, base, [])
    s.worker("w1")
    try:
        wait_for_model(base, MODEL, procs=(api, *s.workers))
        yield s
    finally:
        for p in (*s.workers, s.api, s.queues, *s.streams):
            p.stop()


def story(max_tokens: int) -> dict:
    return {"model": MODEL, "messages": [STORY], "max_tokens": max_tokens, "temperature": 0, "stream": True}


def replayed(base: str, job_id: str) -> str:
    return httpx.get(f"{base}/v1/chat/completions/{job_id}", timeout=60).json()["choices"][0]["message"][
        "content"
    ]


def test_each_key_is_on_its_server_and_the_sdk_streams(split):
    sdk = strict_sdk(split.base)
    stream = sdk.chat.completions.create(**story(24))
    text, job_id, finish = "", "", None
    for chunk in stream:
        job_id = chunk.id
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert finish in ("stop", "length") and text == replayed(split.base, job_id)
    q, s = split.q(), split.s()
    assert job_ids(s) == {job_id} and not job_ids(q)
    on_streams = {k.decode() for k in s.scan_iter(count=1000)}
    assert on_streams and all(k.startswith("ts:{") for k in on_streams), on_streams
    on_queues = {k.decode() for k in q.scan_iter(count=1000)}
    assert "ts:models" in on_queues and any(k.startswith("ts:workers:") for k in on_queues)
    assert not any(k.startswith("ts:{") for k in on_queues), on_queues
    assert int(q.hget("ts:stats", f"tokens:{MODEL}") or 0) > 0


def test_a_worker_killed_mid_stream_and_a_resume(split):
    split.worker("w2")
    reader = Reader(split.base, story(120))
    reader.start()
    for _ in range(5):
        assert reader.chunks.acquire(timeout=60), reader.raw
    assert reader.job_id in running_ids(split.s())
    busy = split.s().hget(keys.job(reader.job_id), keys.JobField.WORKER).decode()
    next(p for p in split.workers if p.name == busy).signal(signal.SIGKILL)
    reader.join(timeout=120)
    parsed = check_stream(reader.raw, "chat")
    assert parsed.error is None and parsed.finish_reason in ("stop", "length"), reader.raw[-500:]
    assert parsed.text == replayed(split.base, reader.job_id)
    assert split.s().hget(keys.job(reader.job_id), keys.JobField.ATTEMPTS) == b"2"  # taken over
    # a client that saw only the first events resumes from the last one it saw
    events = reader.raw.decode().split("\n\n")
    cut = next(i for i, ev in enumerate(events) if '"content":"' in ev and '"content":""' not in ev) + 2
    seen = "\n\n".join(events[:cut]) + "\n\n"
    last_id = [line[4:] for line in seen.splitlines() if line.startswith("id: ")][-1]
    resumed = httpx.get(
        f"{split.base}/v1/chat/completions/{reader.job_id}",
        params={"stream": "true"},
        headers={"Last-Event-ID": last_id},
        timeout=120,
    )
    rest = resumed.content.decode().split("\n\n")
    assert split_events(resumed.content)[-1] == "[DONE]" and '"finish_reason":"' in resumed.text
    before = "".join(_content(ev) for ev in events[:cut])
    assert before and before + "".join(_content(ev) for ev in rest) == parsed.text


def _content(event: str) -> str:
    data = [line[6:] for line in event.splitlines() if line.startswith("data: {")]
    return "".join(
        json.loads(d)["choices"][0]["delta"].get("content") or "" for d in data if '"choices":[{' in d
    )


def test_losing_the_queues_server_leaves_streams_in_flight_running(split):
    """Tokens go to the streams server: a stream in flight ends as usual while the queues
    server is down; a request made then gets a fast 503; the worker serves again after."""
    reader = Reader(split.base, story(100))
    reader.start()
    assert reader.chunks.acquire(timeout=60), reader.raw
    split.queues.signal(signal.SIGKILL)
    refused = httpx.post(split.base + "/v1/chat/completions", json={**story(4), "stream": False}, timeout=30)
    assert refused.status_code == 503, refused.text
    reader.join(timeout=120)
    parsed = check_stream(reader.raw, "chat")
    assert parsed.error is None and parsed.finish_reason in ("stop", "length"), reader.raw[-500:]
    split.restart_queues()
    wait_for_model(split.base, MODEL, timeout=60, procs=(split.api, *split.workers))
    answer = _post_until_served(split.base)
    assert answer["choices"][0]["finish_reason"] in ("stop", "length")


def test_losing_the_streams_server_or_a_primary_ends_streams_in_flight_properly(split):
    """One server restarts without persistence: the job it held is gone, and its stream ends
    with an error and [DONE]. A cluster primary dies: its replica takes over, and the stream
    goes on or ends with an error and [DONE]. Neither hangs; the same worker serves on."""
    reader = Reader(split.base, story(150))
    reader.start()
    assert reader.chunks.acquire(timeout=60), reader.raw
    pid = split.workers[0].pid
    if split.cluster:
        owner = split.s().get_node_from_key(keys.job(reader.job_id)).port
        primary = next(p for p in split.streams if p.name.endswith(f"-{owner}"))
        primary.signal(signal.SIGKILL)
    else:
        server = split.streams[0]
        server.signal(signal.SIGKILL)
        time.sleep(2)
        port = int(split.streams_url.rsplit(":", 1)[1].split("/")[0])
        split.streams = [start_redis(split.logs, port=port)[0]]
    reader.join(timeout=120)
    assert not reader.is_alive()
    parsed = check_stream(reader.raw, "chat")
    if parsed.error is None:  # it went on (a failover, or a restart after its end)
        assert parsed.finish_reason in ("stop", "length")
    else:
        assert parsed.error["code"] in ("not_found", "service_unavailable", "worker_lost"), parsed.error
    answer = _post_until_served(split.base)
    assert answer["choices"][0]["finish_reason"] in ("stop", "length")
    assert split.workers[0].pid == pid and split.workers[0].alive()


def _post_until_served(base: str) -> dict:
    """A request, retried while the API reconnects (503) — within 60 s it is served."""
    deadline = time.monotonic() + 60
    while True:
        r = httpx.post(
            base + "/v1/chat/completions",
            json={"model": MODEL, "messages": [STORY], "max_tokens": 4, "temperature": 0},
            timeout=60,
        )
        if r.status_code == 200 or time.monotonic() > deadline:
            assert r.status_code == 200, r.text
            return r.json()
        time.sleep(0.5)
