"""An embedding pool under two abuses (issue 74), through real processes: one key's floods do
not hold another key's one input behind their backlog, and a Redis too full to
take a job's vectors fails that job once, visibly, rather than having it embedded again and
again."""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from contract import entries, errors, keys, tiers
from contract.keys import JobField
from contract.lua import attempts
from contract.settings import Recovery
from devstack.peek import running_ids
from devstack.processes import Proc, start_api, start_redis, start_worker, wait_for_model
from tests.integration.conftest import MODEL
from tests.system import missing
from tests.unit.recorded import DIGEST, record_queued
from worker.attempts.attempt import Claims
from worker.attempts.publisher import Publisher
from worker.redis.link import Link

pytestmark = pytest.mark.integration

A = {"Authorization": "Bearer sk-flood"}
B = {"Authorization": "Bearer sk-other"}
EMBEDDER = {"POOLING": "mean", "N_CTX": "64", "SLOTS": "2", "EMBEDDING_BATCH_TOKENS": "256"}


@contextlib.contextmanager
def embedding_stack(logs, worker_env: dict[str, str], redis_extra: tuple[str, ...] = ()) -> Iterator:
    redis_proc, url = start_redis(logs, extra=redis_extra)
    procs: list[Proc] = [redis_proc]
    try:
        api, base = start_api(logs, url, env={"API_KEYS": "sk-flood,sk-other", "KEEPALIVE_SECONDS": "0.5"})
        procs.append(api)
        worker = start_worker(logs, url, name="e1", env={**EMBEDDER, **worker_env})
        procs.append(worker)
        wait_for_model(base, MODEL, procs=(api, worker), headers=B, embeddings=True)
        yield base, redis.Redis.from_url(url), worker
    finally:
        for p in reversed(procs):
            p.stop()


def embed(base: str, auth: dict, inputs, timeout: float = 120, **kw) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    with httpx.Client(base_url=base, headers=auth, timeout=timeout) as c:
        resp = c.post("/v1/embeddings", json={"model": MODEL, "input": inputs}, **kw)
    return resp, time.monotonic() - started


@contextlib.contextmanager
def full(r: redis.Redis) -> Iterator[None]:
    """Redis kept full meanwhile: written until a write of 4 KiB is refused, and again as
    room appears (Redis counts the command it reads, and gives back its read buffers later),
    so that the vectors' write is refused while small ones still pass; then emptied."""
    written: list[str] = []
    stop = threading.Event()

    def keep_full() -> None:
        for size in (256 * 1024, 16 * 1024):
            with contextlib.suppress(redis.exceptions.OutOfMemoryError):
                while True:
                    r.set(name := f"ballast:{len(written)}", b"x" * size)
                    written.append(name)
        while not stop.is_set():
            try:
                r.set(name := f"ballast:{len(written)}", b"x" * 4096)
                written.append(name)
            except redis.exceptions.OutOfMemoryError:
                stop.wait(0.005)

    filler = threading.Thread(target=keep_full, daemon=True)
    filler.start()
    try:
        time.sleep(0.5)
        yield
    finally:
        stop.set()
        filler.join(10)
        r.delete(*written)


def running_on(r: redis.Redis, worker: bytes) -> list[str]:
    return [j for j in running_ids(r) if r.hget(keys.job(j), JobField.WORKER) == worker]


def test_another_keys_one_input_is_answered_before_a_flooding_keys_backlog(tmp_path):
    """SLOTS=2: key A's first two large jobs hold both slots and two more wait in the queue.
    Key B's one input is taken next (the guest slot takes another key's job, never A's
    backlog: contract.lua.queues.TAKE) and rides in the next decode (keys take turns), so it
    is answered while all four of A's jobs still embed or wait, and A's two still wait.
    Before, the guest slot took A's third job and B waited for one of A's to end."""
    with embedding_stack(tmp_path, {}) as (base, r, _):
        embed(base, B, "Warm up.")
        flood = [[100 + (i * 13 + j) % 500 for j in range(60)] for i in range(300)]  # 75 decodes each
        answered: list[str] = []  # whose requests were answered, in order

        def send(who: str, auth: dict, inputs) -> None:
            with contextlib.suppress(httpx.HTTPError):  # the stack stops before A's end
                if embed(base, auth, inputs, timeout=600)[0].status_code == 200:
                    answered.append(who)

        floods = [threading.Thread(target=send, args=(f"A{i}", A, flood), daemon=True) for i in range(4)]
        for t in floods:
            t.start()
            time.sleep(0.2)  # in order: A0 and A1 are taken first
        waiting = keys.queue_key(tiers.embedding_pool(MODEL))
        deadline = time.monotonic() + 60
        while len(running_on(r, b"e1")) + r.llen(waiting) < 4 or len(running_on(r, b"e1")) < 2:
            assert time.monotonic() < deadline, "A's jobs did not all start or wait"
            time.sleep(0.05)
        time.sleep(1.0)  # mid-flood: the guest slot has had its chance at A's backlog
        backlog = r.llen(waiting)
        assert backlog == 2, f"the guest slot took A's backlog ({backlog} of A's jobs still wait)"
        resp, took = embed(base, B, "Hello there.", timeout=120)
        print(f"B answered in {took:.2f} s")  # a figure, not a bound: bench/endpoints/embedding_fairness.py
        assert resp.status_code == 200 and len(resp.json()["data"]) == 1
        assert answered == [] and r.llen(waiting) == 2, (answered, r.llen(waiting))


def test_a_job_whose_vectors_a_full_redis_refuses_fails_once_with_storage_full(tmp_path):
    """Redis at maxmemory with noeviction refuses the terminal entry (it carries every vector):
    the client gets 503 storage_full, and the job was embedded once, never requeued."""
    slow = {"STEP_DELAY_SECONDS": "4", "HEARTBEAT_WINDOW_SECONDS": "2"}
    with embedding_stack(tmp_path, slow, ("--maxmemory", "32mb", "--maxmemory-policy", "noeviction")) as (
        base,
        r,
        worker,
    ):
        got: dict = {}
        texts = [f"Input {i}: the cat sat on the mat." for i in range(32)]  # 72 KiB of vectors
        sender = threading.Thread(
            target=lambda: got.update(
                answer=embed(base, B, texts, timeout=180, headers={"Idempotency-Key": "full-1"})[0]
            ),
            daemon=True,
        )
        sender.start()
        deadline = time.monotonic() + 60
        while not (running := running_on(r, b"e1")):
            assert time.monotonic() < deadline and sender.is_alive(), "the job did not start"
            time.sleep(0.05)
        job_id = running[0]
        seen: set[bytes | None] = set()  # the job's attempts, read until it is answered (and deleted)
        with full(r):  # past the decode, the heartbeat window and a reaper tick, or until answered
            held_until = time.monotonic() + 25
            while sender.is_alive() and time.monotonic() < held_until:
                seen.add(r.hget(keys.job(job_id), JobField.ATTEMPTS))
                time.sleep(0.1)
        # room again: a requeued job would now be answered
        while sender.is_alive() and time.monotonic() < held_until + 120:
            seen.add(r.hget(keys.job(job_id), JobField.ATTEMPTS))
            time.sleep(0.1)
        answer = got["answer"]
        log = worker.log()
    assert answer.status_code == 503, answer.text[:300]
    assert answer.json()["error"]["code"] == "storage_full", (seen, answer.text)
    assert seen - {None} == {b"1"}, f"embedded {seen} times"  # None: answered, and so deleted
    assert f"{job_id}: storage_full" in log


@pytest.mark.parametrize("kind", ["valkey", "redis"], ids=["valkey", "redis7"])
def test_a_redis_past_maxmemory_takes_an_attempts_fail_and_beat_but_not_its_entries(tmp_path, kind):
    """What the worker still writes to a full Redis (maxmemory below what it holds, noeviction):
    FAIL's small entry and BEAT's refresh, each behind a first write that grows nothing; an
    APPEND of entries is refused, as a write that may grow memory is."""
    if kind == "redis" and not shutil.which("redis-server"):
        pytest.skip(missing("redis-server"))
    proc, url = start_redis(tmp_path, kind=kind, extra=("--maxmemory-policy", "noeviction"))
    try:
        r = redis.Redis.from_url(url)
        record_queued(r, "embd-full")
        link = Link(r, "w1", Recovery(retention_s=60))
        claims, pub = Claims(link, 3000), Publisher(link)
        attempt = claims.claim("embd-full", DIGEST)
        for i in range(8):
            r.set(f"ballast:{i}", b"x" * 256 * 1024)
        r.config_set("maxmemory", "1mb")  # below what it holds: every write that may grow is refused
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            pub.started(attempt, 5)
        beat = r.register_script(attempts.BEAT)
        assert beat(
            keys=[keys.job("embd-full"), keys.alive("embd-full")], args=[attempt.epoch, 3000, attempt.token]
        )
        assert claims.fail(attempt, errors.STORAGE_FULL.entry(epoch=attempt.epoch))
        assert r.hget(keys.job("embd-full"), JobField.STATUS) == b"failed"
        assert entries.decode(r.xrange(keys.events("embd-full"))[-1][1]).code == "storage_full"
    finally:
        proc.stop()
