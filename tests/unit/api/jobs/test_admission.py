"""Admission: per-key limits apply to API keys only (without keys every client shares the
owner "", and one shared count must not cap the whole server: found by bench/scale_out.py,
429s at 64 open streams with no keys configured); a stream's place is taken before anything
is awaited; a queue's depth is checked and a place held in one step."""

from __future__ import annotations

import asyncio

import fakeredis
import pytest

from api.http.errors import APIError
from api.jobs.admission import Admission, ModelLimits, OpenStreams
from api.jobs.memory import MemoryWatch
from api.jobs.workers import WorkerRegistry
from api.settings import Intake, Quotas
from contract import keys, tiers
from contract.prefixes import UNKNOWN, PromptOverhead

TICKETS: list = []  # streams held open for the length of the test run


def admission(
    settings: Intake | Quotas | None = None, streams: OpenStreams | None = None, client=None
) -> Admission:
    """An Admission with default settings but for the one group given."""
    intake = settings if isinstance(settings, Intake) else Intake()
    quotas = settings if isinstance(settings, Quotas) else Quotas()
    client = client or fakeredis.FakeAsyncRedis()
    memory = MemoryWatch(client, intake.redis_memory_high)
    return Admission(client, WorkerRegistry(client, 15.0), streams or OpenStreams(), memory, intake, quotas)


def holding(owner: str, n: int) -> OpenStreams:
    streams = OpenStreams()
    TICKETS.extend(streams.take(owner) for _ in range(n))
    return streams


def test_stream_limit_is_per_key():
    settings = Quotas(max_streams_per_key=2)
    admission(settings, holding("owner-a", 1)).stream("owner-a")
    admission(settings, holding("owner-b", 2)).stream("owner-a")
    with pytest.raises(APIError) as exc:
        admission(settings, holding("owner-a", 2)).stream("owner-a")
    assert exc.value.status == 429 and exc.value.code == "too_many_streams"
    assert exc.value.headers == {"Retry-After": str(Intake().retry_after_s)}


def test_no_keys_no_stream_limit():
    admission(Quotas(max_streams_per_key=2), holding("", 10_000)).stream("")


def test_zero_means_no_limit():
    admission(Quotas(max_streams_per_key=0), holding("owner-a", 10_000)).stream("owner-a")


def test_a_burst_of_streams_cannot_overshoot_the_limit():
    """The review's race: each check used to pass before any of them counted (several awaits
    later). A place is now taken at the check."""
    gate = admission(Quotas(max_streams_per_key=3))
    admitted, refused = [], 0
    for _ in range(10):
        try:
            admitted.append(gate.stream("owner-a"))
        except APIError:
            refused += 1
    assert (len(admitted), refused) == (3, 7)
    admitted.pop().release()
    admitted.append(gate.stream("owner-a"))  # a released place can be taken again


def test_a_ticket_is_released_once_and_when_dropped():
    streams = OpenStreams()
    t = streams.take("a")
    streams.take("a")  # dropped at once: a response that was never sent
    assert streams.count("a") == 1
    t.release()
    t.release()
    assert streams.count("a") == 0


def test_queue_depth_is_checked_and_reserved_in_one_step():
    async def burst() -> tuple[int, int]:
        client = fakeredis.FakeAsyncRedis()
        await client.zadd(keys.workers("m"), {"w": 10**13})  # a live worker
        gate = admission(Intake(max_queue_depth=4), client=client)
        outcomes = await asyncio.gather(
            *(gate.model("m", f"req-{i}", (1, "messages")) for i in range(10)), return_exceptions=True
        )
        ok = sum(isinstance(o, ModelLimits) for o in outcomes)
        full = sum(isinstance(o, APIError) and o.code == "queue_full" for o in outcomes)
        await gate.release("m", "req-0")
        await gate.model("m", "req-x", (1, "messages"))  # the released place is free again
        return ok, full

    assert asyncio.run(burst()) == (4, 6)


def test_jobs_routed_to_a_worker_s_own_queue_count_in_the_depth():
    async def check() -> APIError:
        client = fakeredis.FakeAsyncRedis()
        await client.zadd(keys.workers("m"), {"w": 10**13})
        for i in range(2):  # waiting in w's routed queue, not the shared ones
            await client.zadd(keys.routed("m"), {tiers.routed_member(f"rq-{i}", "w", "default"): 10**13})
        gate = admission(Intake(max_queue_depth=3), client=client)
        await gate.model("m", "third", (1, "messages"))
        with pytest.raises(APIError) as exc:
            await gate.model("m", "fourth", (1, "messages"))
        return exc.value

    assert asyncio.run(check()).code == "queue_full"


def test_a_prompt_too_long_for_the_model_s_context_is_refused_before_it_is_stored():
    async def check() -> APIError:
        client = fakeredis.FakeAsyncRedis()
        await client.zadd(keys.workers("m"), {"w": 10**13})
        await client.hset(keys.context("m"), "w", 100)
        gate = admission(Intake(prompt_chars_per_token=4), client=client)
        await gate.model("m", "ok", (400, "messages"))
        with pytest.raises(APIError) as exc:
            await gate.model("m", "long", (401, "messages"))
        assert await client.zscore(keys.reserved("m"), "long") is None  # its place given back
        return exc.value

    error = asyncio.run(check())
    assert error.status == 400 and error.code == "string_above_max_length" and error.param == "messages"


def test_new_work_is_refused_before_redis_is_full():
    async def check() -> APIError:
        gate = admission(Intake(redis_memory_high=0.9))
        gate._memory.used, gate._memory.maxmemory = 95, 100
        with pytest.raises(APIError) as exc:
            await gate.model("m", "r", (1, "prompt"))
        return exc.value

    error = asyncio.run(check())
    assert error.status == 503 and error.code == "storage_full" and error.headers["Retry-After"]


def test_the_prompt_bound_outlives_the_workers_that_announced_it():
    """Scaled to zero, a model's prompts are still bounded by the context its workers last
    announced (not by MAX_PROMPT_CHARS alone)."""
    import fakeredis as fr

    from worker.intake.presence import Presence

    server = fr.FakeServer()
    p = Presence(fr.FakeRedis(server=server), "m", "w1", 60, n_ctx=100)
    p.start()  # announces at once
    p.stop()  # a worker leaving (scale to zero) takes its own entry with it

    async def check() -> APIError:
        gate = admission(Intake(known_models=("m",)), client=fr.FakeAsyncRedis(server=server))
        await gate.model("m", "ok", (1000, "messages"))  # 16 characters per token: fits
        await gate.release("m", "ok")
        with pytest.raises(APIError) as exc:
            await gate.model("m", "long", (2000, "messages"))
        return exc.value

    error = asyncio.run(check())
    assert error.status == 400 and "100 tokens" in str(error.message), error.message


def test_the_limits_are_the_largest_context_and_overhead_any_worker_announced():
    limits = ModelLimits.of([b"4096", b"8192"], [b"120 40", b"160 17", b"not one"])
    assert limits == ModelLimits(8192, PromptOverhead(160, 40))
    assert limits.cap(9000) == 8192 and limits.cap(100) == 100
    assert ModelLimits.of([], []) == ModelLimits(0, UNKNOWN)  # nothing announced: the most, uncapped
    assert ModelLimits.of([], []).cap(10**6) == 10**6
