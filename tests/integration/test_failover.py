"""Failovers, where a replica is promoted. Through Redis Sentinel
(`REDIS_URL=redis+sentinel://...`): the primary is SIGKILLed while a stream runs and a
background job waits, the sentinels promote its replica, and the same API and worker
processes carry on with the new primary; the old primary comes back as a replica and a
second failover (nothing held back) moves them again. Behind one name (a managed Redis: a
relay stands for its DNS name), the primary is demoted under open connections, which then
meet READONLY, and the name is repointed at the promoted replica. And a replica held behind
(its link to the primary paused) is promoted without the primary's last writes, while
streams, a resumed stream, a background job and a batch run: what the clients saw is written
again by the worker that wrote it, with the same event ids (docs/protocol.md, "Failover")."""

from __future__ import annotations

import json
import re
import signal
import threading
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
    start_managed,
    start_redis,
    start_watched,
    start_worker,
    wait_for_model,
)
from devstack.sse_contract import check_stream
from tests.integration.conftest import MODEL
from tests.integration.test_batches import jsonl
from tests.integration.test_outage import STORY, Reader

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

    def fail_over(self) -> None:
        """The primary dies (the sentinels promote its replica), or behind one name, the
        managed service promotes the replica and demotes the primary."""
        w = self.watched
        if w.name is not None:
            w.move_name()
            return
        w.primary.signal(signal.SIGKILL)
        w.primary.popen.wait()
        self.wait_for_primary(w.ports["replica"])

    def fail_back(self) -> None:
        """The killed primary comes back on its port (the sentinels make it a replica); once
        in sync, a failover asked of them (an upgrade, a planned move) makes it the primary.
        Behind one name, the old primary, a replica since the failover, is promoted again."""
        w = self.watched
        if w.name is None:
            w.primary, _ = start_redis(self.logs, port=w.ports["primary"])
        old = w.ports["replica"] if w.name is not None else w.ports["primary"]
        with redis.Redis(port=old, socket_timeout=5) as r:
            deadline = time.monotonic() + 30
            while r.info("replication").get("master_link_status") != "up":
                assert time.monotonic() < deadline, "the old primary did not become a replica"
                time.sleep(0.2)
        if w.name is not None:
            w.move_name()
            return
        self.sentinel().execute_command("SENTINEL", "FAILOVER", "tokenspool")
        self.wait_for_primary(w.ports["primary"])

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


def background_answer(base: str, job_id: str) -> dict:
    deadline = time.monotonic() + 90
    while True:
        r = httpx.get(f"{base}/v1/chat/completions/{job_id}", timeout=30)
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
        assert r.wait(1, 5000) == 1  # the replica has every write so far (a lagging one: below)
    s.fail_over()
    busy.join(timeout=120)
    assert not busy.is_alive()
    parsed = check_stream(busy.raw, "chat")  # ends whole, with [DONE]
    assert parsed.error is None and parsed.finish_reason in ("stop", "length"), busy.raw[-600:]
    replay = httpx.get(f"{s.base}/v1/chat/completions/{busy.job_id}", timeout=30).json()
    assert replay["choices"][0]["message"]["content"] == parsed.text  # the new primary has it all
    assert background_answer(s.base, waiting)["choices"][0]["message"]["content"]
    assert answer(s.base)

    # The old primary comes back: the sentinels make it a replica. A failover asked of them
    # (an upgrade, a planned move) makes it the primary again.
    s.fail_back()
    for _ in range(3):
        assert answer(s.base)
    assert ask(s.base, background=True).status_code == 202
    assert (s.api.pid, s.worker.pid) == pids and s.api.alive() and s.worker.alive()
    assert s.worker.log().count('"loading ') == 1  # the model loaded once


def test_behind_one_name_a_demoted_primary_s_readonly_sends_everyone_to_the_new_one(tmp_path):
    watched = start_managed(tmp_path)
    api, base = start_api(tmp_path, watched.url, env=API_ENV)
    worker = start_worker(tmp_path, watched.url, name="w", env=WORKER_ENV)
    try:
        wait_for_model(base, MODEL, procs=(api, worker))
        assert answer(base)  # every process has connected
        busy = Reader(
            base, {"model": MODEL, "messages": [STORY], "max_tokens": 120, "temperature": 0, "stream": True}
        )
        busy.start()
        assert busy.chunks.acquire(timeout=60), busy.raw
        with redis.Redis(port=watched.ports["primary"], socket_timeout=5) as old:
            assert old.wait(1, 5000) == 1
        # connections opened before stay with the old primary until they fail
        watched.move_name()
        busy.join(timeout=120)
        assert not busy.is_alive()
        parsed = check_stream(busy.raw, "chat")
        assert parsed.error is None and parsed.finish_reason in ("stop", "length"), busy.raw[-600:]
        replay = httpx.get(f"{base}/v1/chat/completions/{busy.job_id}", timeout=30).json()
        assert replay["choices"][0]["message"]["content"] == parsed.text
        for _ in range(3):
            assert answer(base)
        assert ask(base, background=True).status_code == 202
        assert api.alive() and worker.alive() and worker.log().count('"loading ') == 1
    finally:
        assert watched.name is not None
        watched.name.close()
        for p in (worker, api, *watched.procs()):
            p.stop()


def _texts(raw: str) -> tuple[str, str]:
    """The content of a chat stream's data events, and the last event id."""
    text, last = "", ""
    for line in raw.splitlines():
        if line.startswith("id: "):
            last = line[4:]
        elif line.startswith("data: {"):
            for choice in json.loads(line[6:]).get("choices", []):
                text += choice["delta"].get("content") or ""
    return text, last


class Leaver(threading.Thread):
    """Reads a stream until told to leave (the connection closes mid-stream), keeping what it
    saw: a client that will resume."""

    def __init__(self, base: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.base, self.body = base, body
        self.raw, self.job_id = "", ""
        self.leave = threading.Event()
        self.left = threading.Event()

    def run(self) -> None:
        with httpx.stream("POST", self.base + "/v1/chat/completions", json=self.body, timeout=120) as resp:
            for line in resp.iter_lines():
                self.raw += line + "\n"
                if line.startswith("data: {") and not self.job_id:
                    self.job_id = line.split('"id":"', 1)[1].split('"', 1)[0]
                if self.leave.is_set() and line == "":
                    break
        self.left.set()


@pytest.fixture(params=["sentinel", "one name"])
def lagging(request, tmp_path) -> Iterator[Stack]:
    """A replica whose link can be held, promoted through Sentinel or behind one name."""
    if request.param == "sentinel":
        watched = start_watched(tmp_path, held_link=True)
    else:
        watched = start_managed(tmp_path, held_link=True)
    api, base = start_api(tmp_path, watched.url, env=API_ENV)
    env = {**WORKER_ENV, "SLOTS": "4", "HEARTBEAT_WINDOW_SECONDS": "3"}
    worker = start_worker(tmp_path, watched.url, name="w", env=env)
    s = Stack(tmp_path, watched, base, api, worker)
    try:
        wait_for_model(base, MODEL, procs=(api, worker))
        yield s
    finally:
        for relay in (watched.link, watched.name):
            if relay is not None:
                relay.close()
        for p in (worker, api, *watched.procs()):
            p.stop()


def test_a_promoted_replica_missing_the_last_writes_contradicts_no_client(lagging):
    s, w = lagging, lagging.watched
    assert w.link is not None
    pids = (s.api.pid, s.worker.pid)
    # sampled (temperature 1), so that text generated again would differ from what was sent
    bodies = [
        {"model": MODEL, "messages": [{"role": "user", "content": f"Tell story number {i}."}]}
        | {"max_tokens": 160, "temperature": 1.0, "stream": True}
        for i in range(3)
    ]
    readers = [Reader(s.base, b) for b in bodies[:2]]
    leaver = Leaver(s.base, bodies[2])
    for t in (*readers, leaver):
        t.start()
    for r in readers:
        assert r.chunks.acquire(timeout=60), r.raw
    upload = httpx.post(
        s.base + "/v1/files",
        files={"file": ("in.jsonl", jsonl(3, max_tokens=30))},
        data={"purpose": "batch"},
        timeout=30,
    ).json()
    batch = httpx.post(
        s.base + "/v1/batches",
        json={"input_file_id": upload["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        timeout=30,
    ).json()
    waiting = ask(s.base, background=True, temperature=1.0, max_tokens=40).json()["id"]
    with redis.Redis(port=w.ports["primary"], socket_timeout=5) as r:
        assert r.wait(1, 5000) == 1  # caught up so far...
    w.link.pause()  # ...and from now on behind: every write from here on is the primary's alone
    time.sleep(1.5)
    leaver.leave.set()
    assert leaver.left.wait(30)
    seen_before_leaving, last_id = _texts(leaver.raw)
    _still_held(w)
    s.fail_over()

    for r in readers:
        r.join(timeout=180)
        assert not r.is_alive()
        parsed = check_stream(r.raw, "chat")  # ends whole, with [DONE]
        assert parsed.error is None and parsed.finish_reason in ("stop", "length"), r.raw[-600:]
        # the end a client was sent from the old primary reaches the new one a moment later
        final = background_answer(s.base, r.job_id)
        assert final.get("choices", [{}])[0].get("message", {}).get("content") == parsed.text, final
        replay = httpx.get(f"{s.base}/v1/chat/completions/{r.job_id}?stream=true", timeout=60).text
        assert _events(replay) == _events(r.raw.decode())  # the same events, with the same ids
    with httpx.stream(
        "GET",
        f"{s.base}/v1/chat/completions/{leaver.job_id}?stream=true",
        headers={"Last-Event-ID": last_id},
        timeout=120,
    ) as resp:
        rest = "".join(line + "\n" for line in resp.iter_lines())
    assert rest.rstrip().endswith("data: [DONE]"), rest[-300:]
    final = background_answer(s.base, leaver.job_id)
    assert seen_before_leaving + _texts(rest)[0] == final["choices"][0]["message"]["content"]
    assert background_answer(s.base, waiting)["choices"][0]["message"]["content"]
    deadline = time.monotonic() + 180
    while (b := httpx.get(f"{s.base}/v1/batches/{batch['id']}", timeout=30).json())["status"] != "completed":
        assert time.monotonic() < deadline and b["status"] in ("validating", "in_progress", "finalizing"), b
        time.sleep(0.5)
    failed = b.get("error_file_id") and httpx.get(f"{s.base}/v1/files/{b['error_file_id']}/content").text
    gone = [line for line in s.api.log().splitlines() if "is gone before it was collected" in line]
    assert b["request_counts"] == {"total": 3, "completed": 3, "failed": 0}, (failed, gone)
    out = httpx.get(f"{s.base}/v1/files/{b['output_file_id']}/content", timeout=30).text.splitlines()
    assert sorted(json.loads(line)["custom_id"] for line in out) == ["req-0", "req-1", "req-2"]
    # What the promoted replica lacked is written again by whichever notices first: an APPEND
    # finding its stream behind, or the durability look finding a new server under attempts
    # that still hold entries no replica acknowledged (under load, often the look).
    said = s.worker.log()
    held = sum(int(n) for n in re.findall(r"writing again what (\d+) attempts hold", said))
    lost = said.count("a failover lost entries") + held
    assert lost >= 1, "the promoted replica lacked nothing: the test did not hold it behind"

    # The old primary comes back as a replica; a failover with nothing held back moves
    # everyone to it again.
    s.fail_back()
    assert answer(s.base)
    assert (s.api.pid, s.worker.pid) == pids and s.api.alive() and s.worker.alive()
    assert "worker_lost" not in s.api.log()


def _still_held(watched: Watched) -> None:
    """The premise of a held-back replica: it still replicates through the relay (sentinels
    point a replica whose link runs elsewhere at the primary itself, once failover-timeout has
    passed: devstack sets it long for a held link; it was 4 s, and a slow start lost it)."""
    assert watched.link is not None
    with redis.Redis(port=watched.ports["replica"], socket_timeout=5) as r:
        assert int(r.info("replication")["master_port"]) == watched.link.port, "the link is not held"


def _events(text: str) -> list[tuple[str, str]]:
    """A stream's events that carry an id (every one but keep-alives and [DONE]): id, data."""
    out = []
    for event in text.split("\n\n"):
        lines = event.splitlines()
        ids = [line[4:] for line in lines if line.startswith("id: ")]
        if ids:
            out.append((ids[0], "".join(line[6:] for line in lines if line.startswith("data: "))))
    return out


def test_split_servers_a_queue_entry_the_queues_failover_lost_is_queued_again(tmp_path):
    """Queues behind Sentinel, streams on a server of their own: the queues primary takes a
    new job's queue entry its replica never gets (the link held) and dies before a replica
    acknowledges it. The streams server keeps the job, its pending mark cleared, so only the
    API, which has not answered yet, knows the entry may be gone: it queues the job again on
    the promoted replica, and the worker (frozen meanwhile, so that it cannot take the job
    first) runs it."""
    watched = start_watched(tmp_path, held_link=True)
    assert watched.link is not None
    streams, streams_url = start_redis(tmp_path)
    env = {"STREAMS_REDIS_URL": streams_url}
    api, base = start_api(tmp_path, watched.url, env={**API_ENV, **env})
    worker = start_worker(tmp_path, watched.url, name="w", env={**WORKER_ENV, **env})
    try:
        wait_for_model(base, MODEL, procs=(api, worker))
        assert answer(base)
        worker.signal(signal.SIGSTOP)
        watched.link.pause()
        answered: list[httpx.Response] = []
        post = threading.Thread(target=lambda: answered.append(ask(base, background=True)), daemon=True)
        post.start()
        time.sleep(0.5)  # recorded and queued; waiting for the replica
        assert not answered
        _still_held(watched)
        watched.primary.signal(signal.SIGKILL)
        watched.primary.popen.wait()
        post.join(timeout=60)
        assert answered and answered[0].status_code == 202, answered
        worker.signal(signal.SIGCONT)
        assert background_answer(base, answered[0].json()["id"])["choices"][0]["message"]["content"]
        assert "lost its queue entry in a failover" in api.log()
    finally:
        watched.link.close()
        for p in (worker, api, streams, *watched.procs()):
            p.stop()


def test_a_job_claimed_on_a_primary_the_sentinels_just_replaced_runs_once_on_the_new_one(tmp_path):
    """After `SENTINEL FAILOVER` the replaced primary takes writes until the sentinels say
    so (about a second) and demote it. A worker that claims a queued job there, its claim
    never reaching the replica, would run it beside the attempt another worker starts on the
    new primary, and a client sent the first attempt's text from the old primary would then
    be sent the second's (a chaos run: `stream_rolled_back`). An attempt writes nothing
    until a replica holds its claim: here the replica's link is held from before the claim,
    the claiming worker frozen across the failover, and the job runs once, on the new
    primary, its stream whole. The failover is made step by step as the sentinels make it (the
    sentinels' own refuses a replica whose link runs through a relay)."""
    watched = start_watched(tmp_path, held_link=True)
    assert watched.link is not None
    api, base = start_api(tmp_path, watched.url, env=API_ENV)
    first = start_worker(tmp_path, watched.url, name="w1", env=WORKER_ENV)
    second = start_worker(tmp_path, watched.url, name="w2", env=WORKER_ENV)

    try:
        wait_for_model(base, MODEL, procs=(api, first, second))
        for w in (first, second):
            w.signal(signal.SIGSTOP)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell a story."}]}
        reader = Reader(base, body | {"max_tokens": 60, "temperature": 1.0, "stream": True})
        reader.start()
        old = redis.Redis(port=watched.ports["primary"], socket_timeout=5)
        deadline = time.monotonic() + 30
        while not (jobs := old.keys("ts:*:job:*")):
            assert time.monotonic() < deadline, "the job was not made"
            time.sleep(0.1)
        assert old.wait(1, 5000) == 1  # the replica has the job, queued
        watched.link.pause()
        first.signal(signal.SIGCONT)
        while old.hget(jobs[0], "epoch") != b"1":  # claimed on the primary alone
            assert time.monotonic() < deadline + 30, "the first worker did not claim the job"
            time.sleep(0.05)
        time.sleep(2)  # long enough to have written tokens (which a client would be sent)
        first.signal(signal.SIGSTOP)
        _still_held(watched)
        _promote_as_sentinel_failover_does(watched)  # the old primary still takes writes
        second.signal(signal.SIGCONT)
        time.sleep(3)
        first.signal(signal.SIGCONT)
        time.sleep(2)
        old.replicaof("127.0.0.1", watched.ports["replica"])  # the sentinels demote it at last
        reader.join(timeout=180)
        assert not reader.is_alive()
        parsed = check_stream(reader.raw, "chat")
        assert parsed.error is None and parsed.finish_reason in ("stop", "length"), reader.raw[-600:]
        final = background_answer(base, reader.job_id)
        assert final["choices"][0]["message"]["content"] == parsed.text
        replay = httpx.get(f"{base}/v1/chat/completions/{reader.job_id}?stream=true", timeout=60).text
        assert _events(replay) == _events(reader.raw.decode())
        # The job ran to its end once: the first worker's attempt ended, fenced out by the
        # second's on the new primary (or claimed there again, before the second came), and
        # it never ran on the replaced primary alone (once, in CI, its wait for the replica
        # ran out there and it wrote the job's tokens).
        job = reader.job_id
        deadline = time.monotonic() + 30
        while not re.search(rf"{job}: (stop|length|fenced)", first.log()):
            assert time.monotonic() < deadline, "the first worker's attempt did not end"
            time.sleep(0.2)
        assert [bool(re.search(rf"{job}: (stop|length)", w.log())) for w in (first, second)].count(True) == 1
        assert "running it anyway" not in first.log()
        assert all(p.alive() for p in (api, first, second))
    finally:
        watched.link.close()
        for p in (second, first, api, *watched.procs()):
            p.stop()


def _promote_as_sentinel_failover_does(watched: Watched) -> None:
    """The replica becomes a primary and the sentinels name it, while the old primary, not
    yet demoted, still takes writes."""
    replica = watched.ports["replica"]
    with redis.Redis(port=replica, socket_timeout=5) as r:
        r.replicaof("NO", "ONE")
    for node in watched.url.split("//", 1)[1].split("/", 1)[0].split(","):
        with redis.Redis(port=int(node.rsplit(":", 1)[1]), socket_timeout=5) as sentinel:
            sentinel.execute_command("SENTINEL", "REMOVE", "tokenspool")
            sentinel.execute_command("SENTINEL", "MONITOR", "tokenspool", "127.0.0.1", replica, 2)
            sentinel.execute_command("SENTINEL", "SET", "tokenspool", "down-after-milliseconds", 1000)


@pytest.mark.parametrize(
    ("stop", "within_s"), [(signal.SIGKILL, 2.0), (signal.SIGSTOP, 3.0)], ids=["refusing", "silent"]
)
def test_with_the_sentinels_and_their_servers_down_a_request_is_refused_in_time(tmp_path, stop, within_s):
    """Through Sentinel as with one server: Redis away is a 503 at once when it refuses
    connections, where redis-py's default retries on each sentinel's connection made it
    wait 16-48 s; and within REDIS_TIMEOUT_SECONDS (2 s here) when nothing answers at all
    (stopped: connections are accepted, nothing is read), not that for each sentinel."""
    watched = start_watched(tmp_path)
    api, base = start_api(tmp_path, watched.url, env=API_ENV | {"REDIS_TIMEOUT_SECONDS": "2"})
    try:
        deadline = time.monotonic() + 30
        while httpx.get(base + "/readyz").status_code != 200:
            assert time.monotonic() < deadline, api.log()[-2000:]
            time.sleep(0.1)
        for p in watched.procs():
            p.signal(stop)
        started = time.monotonic()
        refused = httpx.post(
            base + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2}, timeout=120
        )
        took = time.monotonic() - started
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "service_unavailable"
        assert took < within_s, took
    finally:
        for p in watched.procs():
            p.signal(signal.SIGCONT)
        for p in (api, *watched.procs()):
            p.stop()
