"""Redis goes away and comes back (1 s, then 12 s: past the streams' outage limit), with and
without AOF, on both servers: every worker lives through it in whatever state it was (idle,
full, busy, starting), the same process with its model loaded once, and serves the next
request; the API answers a request during the outage with a fast 503; streams in flight
continue, or end with an error and [DONE] and resume once Redis is back; a job Redis forgot
(no AOF) ends with an error."""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from contract import keys
from devstack.processes import Proc, start_api, start_redis, start_worker, wait_for_model
from devstack.sse_contract import check_stream, split_events
from tests.integration.conftest import MODEL, _server_kinds

pytestmark = pytest.mark.integration

IDLE_MODEL = "SmolLM2-idle"  # the same GGUF under another name: a worker nobody sends work to
OUTAGE_S = 5  # a stream whose Redis stays away longer ends with an error (the default: 10)
API_ENV = {"KEEPALIVE_SECONDS": "0.5", "CANCEL_GRACE_SECONDS": "60", "STREAM_OUTAGE_SECONDS": str(OUTAGE_S)}
WORKER_ENV = {"SLOTS": "1", "HEARTBEAT_WINDOW_SECONDS": "2", "REDIS_WAIT_SECONDS": "60"}
STORY = {"role": "user", "content": "Write a long story about a lighthouse keeper, a storm and a ship."}


@dataclass
class Outage:
    logs: Path
    kind: str
    aof: bool
    port: int
    redis_proc: Proc
    base: str
    api: Proc
    workers: dict[str, Proc]

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=5)

    def stop_redis(self) -> None:
        self.redis_proc.signal(signal.SIGKILL)  # a crash, not a polite shutdown
        self.redis_proc.popen.wait()

    def start_redis(self) -> None:
        self.redis_proc, _ = start_redis(self.logs, kind=self.kind, port=self.port, appendonly=self.aof)

    def worker(self, name: str, model: str = MODEL) -> Proc:
        env = {**WORKER_ENV, **({"MODEL_NAME": model} if model != MODEL else {})}
        self.workers[name] = start_worker(self.logs, f"redis://127.0.0.1:{self.port}/0", name=name, env=env)
        return self.workers[name]


@pytest.fixture(params=_server_kinds())
def redis_kind(request):
    return request.param


@pytest.fixture(params=[pytest.param(True, id="aof"), pytest.param(False, id="no-aof")])
def outage(request, redis_kind, tmp_path):
    kind = redis_kind
    proc, url = start_redis(tmp_path, kind=kind, appendonly=request.param)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    api, base = start_api(tmp_path, url, env=API_ENV)
    o = Outage(tmp_path, kind, request.param, port, proc, base, api, {})
    o.worker("busy")
    o.worker("idle", IDLE_MODEL)
    try:
        wait_for_model(base, MODEL, procs=(api, *o.workers.values()))
        wait_for_model(base, IDLE_MODEL, procs=(api, *o.workers.values()))
        yield o
    finally:
        for p in (*o.workers.values(), api, o.redis_proc):
            p.stop()


class Reader(threading.Thread):
    """Reads one SSE stream to its end in the background (the main thread breaks Redis)."""

    def __init__(self, base: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.base, self.body = base, body
        self.raw = b""
        self.job_id = ""
        self.chunks = threading.Semaphore(0)

    def run(self) -> None:
        with httpx.stream("POST", self.base + "/v1/chat/completions", json=self.body, timeout=120) as resp:
            for line in resp.iter_lines():
                self.raw += (line + "\n").encode()
                if line.startswith("data: {") and not self.job_id:
                    self.job_id = line.split('"id":"', 1)[1].split('"', 1)[0]
                if '"content":"' in line and '"content":""' not in line:
                    self.chunks.release()

    def last_id(self) -> str:
        ids = [line[4:] for line in self.raw.decode().splitlines() if line.startswith("id: ")]
        return ids[-1]


def test_workers_and_streams_live_through_redis_restarts(outage):
    o = outage
    pids = {name: p.pid for name, p in o.workers.items()}
    for down_s in (1, 12):
        busy = Reader(
            o.base,
            {
                "model": MODEL,
                "messages": [STORY],
                "max_tokens": 150,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        busy.start()
        assert busy.chunks.acquire(timeout=60), busy.raw  # the busy worker is generating
        waiting = httpx.post(
            o.base + "/v1/chat/completions",
            json={"model": MODEL, "messages": [STORY], "max_tokens": 8, "background": True},
        ).json()["id"]
        if down_s == 12:
            o.worker("starting")  # loads its model while Redis is away
        o.stop_redis()
        took = time.monotonic()
        refused = httpx.post(
            o.base + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2}
        )
        took = time.monotonic() - took
        assert refused.status_code == 503 and refused.headers["retry-after"] and took < 3, (
            refused.text,
            took,
        )
        assert refused.json()["error"]["code"] == "service_unavailable"
        assert httpx.get(o.base + "/readyz").status_code == 503
        time.sleep(down_s)
        o.start_redis()
        busy.join(timeout=120)
        assert not busy.is_alive()
        _check_the_stream_after(o, busy, down_s)
        _check_the_waiting_job(o, waiting)
        # the same processes, each with its model loaded once, serve the next requests
        for name, p in o.workers.items():
            assert p.alive() and p.pid == pids.setdefault(name, p.pid), p.log()[-3000:]
            assert p.log().count('"loading ') == 1
        _each_worker_serves(o)


def _check_the_stream_after(o: Outage, reader: Reader, down_s: int) -> None:
    parsed = check_stream(reader.raw, "chat", include_usage=True)
    if not o.aof:  # Redis forgot the job: the stream ends with an error, and [DONE]
        assert parsed.error is not None and parsed.error["code"] in ("not_found", "service_unavailable")
        return
    if parsed.error is None:  # the outage was shorter than STREAM_OUTAGE_SECONDS: it went on
        assert down_s < OUTAGE_S and parsed.finish_reason in ("stop", "length")
        return
    # a long outage ended the stream with an error and [DONE]; resuming now gets the rest
    assert parsed.error["code"] == "service_unavailable" and down_s > OUTAGE_S
    resumed = httpx.get(
        f"{o.base}/v1/chat/completions/{reader.job_id}",
        params={"stream": "true"},
        headers={"Last-Event-ID": reader.last_id()},
        timeout=120,
    )
    events = split_events(resumed.content)
    assert events[-1] == "[DONE]" and '"finish_reason":"' in resumed.text
    replay = httpx.get(f"{o.base}/v1/chat/completions/{reader.job_id}", timeout=60).json()
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in _chunks(reader.raw + resumed.content))
    assert text == replay["choices"][0]["message"]["content"]


def _chunks(raw: bytes) -> list[dict]:
    return [json.loads(d) for d in split_events(raw) if d.startswith("{") and '"choices":[{' in d]


def _check_the_waiting_job(o: Outage, job_id: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = httpx.get(f"{o.base}/v1/chat/completions/{job_id}", timeout=30)
        if r.status_code not in (202, 503):  # 503: the API has not reconnected yet; try again
            break
        time.sleep(0.2)
    if o.aof:
        assert r.status_code == 200, r.text  # it waited in its queue and ran
    else:
        assert r.status_code == 404, r.text  # Redis forgot it


def _loop_is_back(p: Proc) -> bool:
    """The worker's loop has said that Redis is back as often as it said it was gone (its
    backoff is capped at 2 s: until then another worker could take every job)."""
    log = p.log()
    return log.count("worker loop: Redis unreachable") == log.count("worker loop: Redis is back")


def _each_worker_serves(o: Outage) -> None:
    """Two requests for the model at once (each of its workers has one slot) and one for the
    idle worker's: every worker takes one. (After a restart without persistence Redis knows
    no worker until they announce themselves again, within ANNOUNCE_SECONDS.)"""
    for model in (MODEL, IDLE_MODEL):
        wait_for_model(o.base, model, timeout=30, procs=tuple(o.workers.values()))
    r = o.client()
    deadline = time.monotonic() + 30  # every worker's loop is back (registered with RQ again)
    while time.monotonic() < deadline and not all(
        r.sismember("rq:workers", f"rq:worker:{name}") and _loop_is_back(p) for name, p in o.workers.items()
    ):
        time.sleep(0.2)
    # Long enough that the first worker to take one is still busy when the second is offered.
    bodies = [(MODEL, 120), (MODEL, 120), (IDLE_MODEL, 2)]
    with httpx.Client(timeout=120) as http:
        answers = [
            http.post(
                o.base + "/v1/chat/completions",
                json={
                    "model": m,
                    "messages": [STORY],
                    "max_tokens": n,
                    "temperature": 0,
                    "background": True,
                },
            )
            for m, n in bodies
        ]
        assert [a.status_code for a in answers] == [202] * 3, [a.text for a in answers]
        started = [a.json()["id"] for a in answers]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(
            r.hget(keys.job(job_id), keys.JobField.STATUS) not in (b"done",) for job_id in started
        ):
            time.sleep(0.1)
        assert [r.hget(keys.job(job_id), keys.JobField.STATUS) for job_id in started] == [b"done"] * 3
        served = {r.hget(keys.job(job_id), keys.JobField.WORKER) for job_id in started}
        assert served == {name.encode() for name in o.workers}
        assert all(r.sismember("rq:workers", f"rq:worker:{name}") for name in o.workers)  # RQ knows them
