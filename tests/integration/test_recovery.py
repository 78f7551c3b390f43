"""Workers die, hang, shut down, and Redis restarts: every stream still ends properly, and
where a surviving worker exists it continues the completion without a gap or a repeat."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest
import redis

from contract import entries, keys
from contract.entries import Delta, Finished, Started
from devstack.peek import running_ids
from devstack.processes import Proc, start_api, start_redis, start_worker, wait_for_model
from devstack.sse_contract import check_stream, read_opening
from tests.hold import HOLD_TOKENS, NO_END
from tests.integration.conftest import MODEL

pytestmark = pytest.mark.integration

WORKER_ENV = {"HEARTBEAT_WINDOW_SECONDS": "2", "RESUME_WAIT_SECONDS": "20", "SHUTDOWN_GRACE_SECONDS": "1"}
API_ENV = {
    "KEEPALIVE_SECONDS": "0.5",
    "REAPER_INTERVAL_SECONDS": "0.2",
    "REAPER_SETTLE_SECONDS": "1",
    "CANCEL_GRACE_SECONDS": "0",
}
LONG = {"role": "user", "content": "Write a long story about a lighthouse keeper, a storm and a ship."}


@dataclass
class Pool:
    logs: Path
    redis_url: str
    base: str
    r: redis.Redis
    redis_proc: Proc
    api: Proc
    workers: dict[str, Proc] = field(default_factory=dict)
    n: int = 0

    def spawn(self, env: dict[str, str] | None = None) -> Proc:
        self.n += 1
        name = f"w{self.n}"
        self.workers[name] = start_worker(
            self.logs, self.redis_url, name=name, env={**WORKER_ENV, **(env or {})}
        )
        return self.workers[name]

    def ensure(self, count: int) -> None:
        for name, p in list(self.workers.items()):
            if not p.alive():
                del self.workers[name]
        while len(self.workers) < count:
            self.spawn()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            live = self.r.zcount(keys.workers(MODEL), int(time.time() * 1000) - 3000, "+inf")
            named = {c["name"] for c in self.r.client_list()}
            if live >= count and all(keys.WORKER_CONNECTION_PREFIX + n in named for n in self.workers):
                return
            time.sleep(0.1)
        raise TimeoutError("workers did not come up")

    def holder(self, job_id: str, timeout: float = 20) -> Proc:
        """The worker process running the job's current attempt."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            name = self.r.hget(keys.job(job_id), keys.JobField.WORKER)
            if name and self.r.hget(keys.job(job_id), keys.JobField.STATUS) == b"running":
                return self.workers[name.decode()]
            time.sleep(0.01)
        raise TimeoutError(f"{job_id} never started")

    def events(self, job_id: str) -> list:
        return [entries.decode(f) for _, f in self.r.xrange(keys.events(job_id))]


@contextlib.contextmanager
def running_pool(logs: Path, api_env: dict[str, str] | None = None) -> Iterator[Pool]:
    """Redis, an API and two workers of the model, SIGKILLed at the end (a test may have
    started more, or killed some)."""
    redis_proc, url = start_redis(logs)
    api, base = start_api(logs, url, env={**API_ENV, **(api_env or {})})
    p = Pool(logs, url, base, redis.Redis.from_url(url), redis_proc, api)
    try:
        p.ensure(2)
        wait_for_model(base, MODEL, procs=(api,))
        yield p
    finally:
        for w in p.workers.values():
            w.signal(signal.SIGKILL)
        api.stop()
        redis_proc.stop()


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    with running_pool(tmp_path_factory.mktemp("recovery")) as p:
        yield p


def _open_stream(pool: Pool, body: dict):
    return httpx.stream("POST", pool.base + "/v1/chat/completions", json=body, timeout=120)


def _read_until(lines, pred) -> list[str]:
    """Read SSE lines until pred(content chunks so far) holds; returns the raw lines read."""
    got, contents = [], 0
    for line in lines:
        got.append(line)
        if line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
            contents += 1
        if pred(contents):
            break
    return got


def _raw(lines: list[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode()


def _check_resumed(pool: Pool, raw: bytes, job_id: str, max_tokens: int):
    parsed = check_stream(raw, "chat", include_usage=True)
    assert parsed.error is None, parsed.error
    events = pool.events(job_id)
    deltas = [e for e in events if isinstance(e, Delta)]
    final = events[-1]
    assert isinstance(final, Finished)
    # one continuous completion: what the client got is exactly what was published once
    assert parsed.text == "".join(d.text for d in deltas)
    assert (
        parsed.usage["completion_tokens"] == sum(len(d.token_ids) for d in deltas) == final.completion_tokens
    )
    assert final.completion_tokens <= max_tokens
    assert parsed.usage["prompt_tokens"] == next(e for e in events if isinstance(e, Started)).prompt_tokens
    return parsed, events


def _interrupted(pool: Pool, max_tokens: int, after_chunks: int, act, usage: bool = True, **body):
    """Stream a completion from the pool; once `after_chunks` content chunks have arrived,
    call act(job id, the worker holding the job); read to the end. Returns the
    job id, that worker, and the raw bytes the client received."""
    body = {
        "model": MODEL,
        "messages": [LONG],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        **({"stream_options": {"include_usage": True}} if usage else {}),
        **body,
    }
    with _open_stream(pool, body) as resp:
        lines = resp.iter_lines()
        first, opening = read_opening(lines)
        job_id = opening["id"]
        holder = pool.holder(job_id)
        got = [*first, *(_read_until(lines, lambda n: n >= after_chunks) if after_chunks else [])]
        act(job_id, holder)
        got += list(lines)
    return job_id, holder, _raw(got)


def _signal_at(sig: int, t: dict):
    def act(job_id: str, worker: Proc) -> None:
        worker.signal(sig)
        t["at"] = time.monotonic()

    return act


@pytest.mark.parametrize("cut", ["before-first-token", "mid-stream"])
def test_sigkill_resumes_on_the_other_worker(pool, cut):
    pool.ensure(2)
    t: dict = {}
    job_id, victim, raw = _interrupted(
        pool, 60, 20 if cut == "mid-stream" else 0, _signal_at(signal.SIGKILL, t)
    )
    _, events = _check_resumed(pool, raw, job_id, 60)
    starts = [e for e in events if isinstance(e, Started)]
    assert starts[-1].epoch > 1, "a later attempt finished the job"  # (the victim may die before its Started)
    assert starts[-1].worker != victim.name
    assert time.monotonic() - t["at"] < 30


def test_sigkill_right_after_the_last_token(pool):
    pool.ensure(2)

    def kill_after_11_tokens(job_id: str, victim: Proc) -> None:
        while sum(len(e.token_ids) for e in pool.events(job_id) if isinstance(e, Delta)) < 11:
            time.sleep(0.002)
        victim.signal(signal.SIGKILL)

    job_id, _, raw = _interrupted(pool, 12, 0, kill_after_11_tokens)
    _check_resumed(pool, raw, job_id, 12)


def test_sigstop_past_the_heartbeat_window_then_sigcont_is_fenced(pool):
    pool.ensure(2)
    t: dict = {}
    job_id, frozen, raw = _interrupted(pool, 60, 10, _signal_at(signal.SIGSTOP, t))
    resumed_after = time.monotonic() - t["at"]
    try:
        _, events = _check_resumed(pool, raw, job_id, 60)
        starts = [e for e in events if isinstance(e, Started)]
        assert len(starts) == 2 and starts[1].worker != frozen.name
        frozen_epoch = starts[0].epoch
    finally:
        frozen.signal(signal.SIGCONT)
    # the woken worker's next write is refused: nothing more with its epoch, and it moves on
    time.sleep(3)
    after = pool.events(job_id)
    assert after == events
    assert all(e.epoch != frozen_epoch for e in after[after.index(starts[1]) :])
    assert "fenced" in frozen.log()
    assert frozen.alive()
    assert resumed_after < 60


def test_sdk_stream_survives_a_worker_kill(pool):
    pool.ensure(2)
    sdk = openai.OpenAI(base_url=pool.base + "/v1", api_key="x", max_retries=0)
    stream = sdk.chat.completions.create(
        model=MODEL,
        messages=[LONG],
        max_tokens=50,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = []
    for chunk in stream:
        chunks.append(chunk)
        if len(chunks) == 10:
            pool.holder(chunk.id).signal(signal.SIGKILL)
    roles = [c for c in chunks if c.choices and c.choices[0].delta.role]
    finishes = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(roles) == 1 and len(finishes) == 1
    assert chunks[-1].usage.completion_tokens == sum(
        len(e.token_ids) for e in pool.events(chunks[0].id) if isinstance(e, Delta)
    )


def test_sigterm_hands_the_job_off_and_the_worker_exits(pool):
    """The job cannot end within the worker's grace (its end tokens are banned), however
    fast the machine: it is handed off, resumed elsewhere, then cancelled."""
    pool.ensure(2)

    def act(job_id: str, worker: Proc) -> None:
        worker.signal(signal.SIGTERM)
        threading.Thread(target=_cancel_once_resumed, args=(pool, job_id), daemon=True).start()

    job_id, leaving, raw = _interrupted(pool, HOLD_TOKENS, 5, act, logit_bias=NO_END)
    _, events = _check_resumed(pool, raw, job_id, HOLD_TOKENS)
    starts = [e for e in events if isinstance(e, Started)]
    assert len(starts) == 2 and starts[1].worker != leaving.name
    leaving.popen.wait(timeout=30)
    assert "handed off" in leaving.log()


def _cancel_once_resumed(pool: Pool, job_id: str) -> None:
    """Cancel the job once a second attempt has generated."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        events = pool.events(job_id)
        starts = [i for i, e in enumerate(events) if isinstance(e, Started)]
        if len(starts) > 1 and any(isinstance(e, Delta) for e in events[starts[1] :]):
            break
        time.sleep(0.05)
    httpx.post(f"{pool.base}/v1/chat/completions/{job_id}/cancel", timeout=30)


def test_cancel_endpoint_stops_the_job_and_frees_the_worker(pool):
    pool.ensure(2)

    def cancel(job_id: str, _: Proc) -> None:
        r = httpx.post(f"{pool.base}/v1/chat/completions/{job_id}/cancel")
        assert r.status_code == 200 and r.json()["id"] == job_id
        assert httpx.post(f"{pool.base}/v1/completions/{job_id}/cancel").status_code == 404

    job_id, _, raw = _interrupted(pool, 2000, 5, cancel, usage=False, temperature=1.0)
    parsed = check_stream(raw, "chat")
    assert parsed.finish_reason == "stop" and parsed.error is None
    final = pool.events(job_id)[-1]
    assert isinstance(final, Finished) and final.completion_tokens < 300
    again = httpx.post(f"{pool.base}/v1/chat/completions/{job_id}/cancel").json()
    assert again["status"] == "cancelled"  # a cancelled job keeps its own status
    # both workers take jobs again
    for _ in range(2):
        r = httpx.post(
            pool.base + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2}, timeout=60
        )
        assert r.status_code == 200
    assert httpx.post(f"{pool.base}/v1/chat/completions/chatcmpl-nope/cancel").status_code == 404


def test_killing_the_only_worker_ends_with_worker_lost(tmp_path):
    redis_proc, url = start_redis(tmp_path)
    api, base = start_api(
        tmp_path, url, env={**API_ENV, "RESUME_WAIT_SECONDS": "2", "KEEPALIVE_SECONDS": "0.3"}
    )
    worker = start_worker(tmp_path, url, name="only", env=WORKER_ENV)
    r = redis.Redis.from_url(url)
    try:
        wait_for_model(base, MODEL, procs=(worker, api))
        body = {"model": MODEL, "messages": [LONG], "max_tokens": 200, "stream": True}
        with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=60) as resp:
            lines = resp.iter_lines()
            got, _ = read_opening(lines)
            got += _read_until(lines, lambda n: n >= 3)
            worker.signal(signal.SIGKILL)
            killed = time.monotonic()
            got += list(lines)
        parsed = check_stream(_raw(got), "chat")
        assert parsed.error["code"] == "worker_lost" and parsed.error["type"] == "server_error"
        assert time.monotonic() - killed < 15
        job_id = next(json.loads(x[6:]) for x in got if x.startswith("data: "))["id"]
        assert r.hget(keys.job(job_id), keys.JobField.STATUS) == b"failed"

        # not streaming: 503 with the same error object
        worker = start_worker(tmp_path, url, name="only2", env=WORKER_ENV)
        wait_for_model(base, MODEL, procs=(worker, api))
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            future = ex.submit(
                httpx.post, base + "/v1/chat/completions", json={**body, "stream": False}, timeout=60
            )
            deadline = time.monotonic() + 30
            while not running_ids(r) and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.3)
            worker.signal(signal.SIGKILL)
            resp = future.result()
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "worker_lost"
    finally:
        worker.signal(signal.SIGKILL)
        api.stop()
        redis_proc.stop()


def test_sigkill_of_a_batching_worker_with_4_jobs_in_flight(pool):
    """One worker holds 4 streams in one batch; it dies mid-stream; another worker resumes
    all 4 (each with its prompt plus its published tokens) and every stream ends properly."""
    for w in pool.workers.values():
        w.signal(signal.SIGKILL)
    pool.workers.clear()
    victim = pool.spawn({"SLOTS": "4"})
    pool.ensure(1)
    questions = ["a lighthouse keeper", "a dragon", "a sailor", "a clockmaker"]

    def stream(topic: str):
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"Write a long story about {topic}."}],
            "max_tokens": 60,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with _open_stream(pool, body) as resp:
            lines = resp.iter_lines()
            first, opening = read_opening(lines)
            return opening["id"], _raw([*first, *lines])

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        futures = [ex.submit(stream, q) for q in questions]
        # all 4 running in the one worker, each with some tokens out, then it dies
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            running = [
                job_id
                for job_id in running_ids(pool.r)
                if pool.r.hget(keys.job(job_id), keys.JobField.WORKER) == victim.name.encode()
            ]
            if len(running) == 4 and all(
                sum(isinstance(e, Delta) for e in pool.events(job_id)) >= 5 for job_id in running
            ):
                break
            time.sleep(0.05)
        assert len(running) == 4, "the worker did not hold 4 jobs at once"
        victim.signal(signal.SIGKILL)
        victim.popen.wait(timeout=10)
        del pool.workers[victim.name]
        pool.spawn()  # a fresh worker takes the 4 continuations
        results = [f.result(timeout=180) for f in futures]
    assert sorted(job_id for job_id, _ in results) == sorted(running)
    for job_id, raw in results:
        _, events = _check_resumed(pool, raw, job_id, 60)
        starts = [e for e in events if isinstance(e, Started)]
        assert starts[0].worker == victim.name and starts[-1].worker != victim.name
