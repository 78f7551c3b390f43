"""api/endpoints/embeddings/routes.py: an embeddings job is deleted once answered (its vectors are
never kept), its Idempotency-Key freed unless a retry attached since, and what it reserves of
its key's token budget; on fakeredis through the real job store."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import fakeredis
from starlette.requests import Request
from starlette.responses import Response

from api.endpoints.catalog import EMBEDDINGS
from api.endpoints.embeddings.routes import GONE, EmbeddingRoutes, routes
from api.endpoints.routes import JobRequest
from api.jobs.admission import Admission, ModelLimits, OpenStreams
from api.jobs.owners import Idempotency
from api.jobs.reservation import EMBED_SPECIALS
from api.jobs.store import JobStore
from api.pool_settings import Lifetimes
from api.settings import Intake, Quotas, Settings
from contract import entries, keys
from contract.entries import Finished
from contract.jobspec import JobSpec
from contract.keys import JobField, JobStatus
from contract.prefixes import PromptOverhead
from contract.settings import Recovery
from tests.fake_servers import FakePair

JOB = "embd-routes1"
KEY = Idempotency(key=keys.idempotency("owner-1", "f" * 64), digest="d" * 64)
ATTACHED_MS = 1_000


def recorded(pair: FakePair, kept_at: int = 0) -> None:
    """An ended embed job, its vectors in its stream, and the Idempotency-Key naming it."""
    r = pair.sync()
    fields = {JobField.STATUS: JobStatus.DONE, JobField.MODEL: "e#embed", JobField.ENDED: 1}
    if kept_at:
        fields[JobField.KEPT_AT] = kept_at
    r.streams.hset(keys.job(JOB), mapping=fields)
    end = Finished(
        finish_reason="stop", prompt_tokens=4, completion_tokens=0, vectors=b"\0" * 16, dimensions=4
    )
    r.streams.xadd(keys.events(JOB), entries.encode(end), id="1-0")
    r.queues.set(KEY.key, KEY.holding(JOB))


def settings(**kw) -> Settings:
    return Settings(lifetimes=Lifetimes(cancel_grace_s=0.01), **kw)


def answered(pair: FakePair, status: int, idempotency: Idempotency | None) -> None:
    async def go() -> None:
        aio = pair.aio()
        services = SimpleNamespace(
            settings=settings(), jobs=JobStore(aio, pair.sync(), queue_wait_s=60, recovery=Recovery())
        )
        ask = JobRequest(None, services, None, "owner-1", idempotency, 10)  # type: ignore[arg-type]
        await EmbeddingRoutes(EMBEDDINGS).answered(
            services, JOB, ask, Response(status_code=status), ATTACHED_MS
        )

    asyncio.run(go())


def kept(pair: FakePair) -> tuple[bool, bool, bool]:
    """(the job's hash, its stream, its Idempotency-Key) are still there."""
    r = pair.sync()
    return (
        bool(r.streams.exists(keys.job(JOB))),
        bool(r.streams.exists(keys.events(JOB))),
        bool(r.queues.exists(KEY.key)),
    )


def test_embeddings_are_created_by_a_post_to_their_path_only():
    (route,) = routes()
    assert route.path == "/v1/embeddings" and (route.methods or set()) - {"HEAD"} == {"POST"}
    handler = route.endpoint.__self__  # type: ignore[attr-defined]
    assert isinstance(handler, EmbeddingRoutes) and handler.endpoint is EMBEDDINGS


def test_an_answered_job_is_deleted_at_once():
    pair = FakePair()
    recorded(pair)
    answered(pair, 200, None)
    assert kept(pair)[:2] == (False, False)


def test_an_answered_job_frees_its_idempotency_key_so_a_retry_embeds_again():
    pair = FakePair()
    recorded(pair)
    answered(pair, 200, KEY)
    assert kept(pair) == (False, False, False)


def test_a_key_naming_another_job_is_not_freed():
    """The key was taken again since (this job's request expired from it): it is not this job's."""
    pair = FakePair()
    recorded(pair)
    pair.sync().queues.set(KEY.key, KEY.holding("embd-other"))
    answered(pair, 200, KEY)
    assert kept(pair) == (False, False, True)


def test_a_job_a_retry_attached_to_since_is_left_for_that_retry():
    pair = FakePair()
    recorded(pair, kept_at=ATTACHED_MS + 1)
    answered(pair, 200, KEY)
    assert kept(pair) == (True, True, True)


def test_a_client_gone_leaves_the_job_for_a_retry_that_comes_back_within_the_grace():
    pair = FakePair()
    recorded(pair, kept_at=ATTACHED_MS - 1)  # attached before this client: not a retry of it
    answered(pair, GONE, KEY)
    assert kept(pair) == (False, False, False)

    pair = FakePair()
    recorded(pair)

    async def retry_meanwhile() -> None:  # a retry attaches during the grace
        aio = pair.aio()
        services = SimpleNamespace(
            settings=Settings(lifetimes=Lifetimes(cancel_grace_s=0.2)),
            jobs=JobStore(aio, pair.sync(), queue_wait_s=60, recovery=Recovery()),
        )
        ask = JobRequest(None, services, None, "owner-1", KEY, 10)  # type: ignore[arg-type]
        gone = EmbeddingRoutes(EMBEDDINGS).answered(services, JOB, ask, Response(status_code=GONE), 0)
        task = asyncio.ensure_future(gone)
        await asyncio.sleep(0.01)
        await services.jobs.keep(JOB)
        await task

    asyncio.run(retry_meanwhile())
    assert kept(pair) == (True, True, True)


def test_a_lost_redis_leaves_the_job_to_expire_without_failing_the_answer():
    pair = FakePair()
    recorded(pair)
    pair.streams.connected = False
    answered(pair, 200, KEY)  # does not raise
    pair.streams.connected = True
    assert kept(pair) == (True, True, True)


def test_its_inputs_are_reserved_token_arrays_exactly_and_strings_as_their_bytes_and_specials():
    async def go():
        quotas = Quotas(max_jobs_per_key=7, key_tokens_per_minute=900)
        admission = Admission(fakeredis.FakeAsyncRedis(), None, OpenStreams(), None, Intake(), quotas)  # type: ignore[arg-type]
        services = SimpleNamespace(settings=settings(quotas=quotas), admission=admission)
        request = Request({"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b""})
        ask = JobRequest(request, services, None, "owner-1", None, 321)  # type: ignore[arg-type]
        spec = JobSpec(id=JOB, kind="embed", model="e#embed", inputs=("héllo", (1, 2, 3), "ab"), max_tokens=0)
        limits = ModelLimits(context=8, overhead=PromptOverhead(fixed=500, per_part=50))
        return EmbeddingRoutes(EMBEDDINGS)._quota(ask, spec, limits)

    quota = asyncio.run(go())
    strings = len("héllo".encode()) + EMBED_SPECIALS + len(b"ab") + EMBED_SPECIALS
    assert quota.tokens == quota.prompt_tokens == strings + 3  # no template overhead, no completion
    assert quota.tokens > 8  # each input has a context of its own: not capped at one
    assert (quota.unfinished_jobs, quota.request_bytes) == (7, 321)
    assert quota.budgets.tokens_per_minute == 900  # the key's budget, from its grant or the default
