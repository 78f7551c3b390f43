"""`POST /v1/embeddings`. An embeddings request is a job like a completion. It is made and
admitted the same way (api/endpoints/routes.py). It runs in the model's embedding pool: its
queue, its workers. It has no stream and no id a client could name again. The answer is the
whole list, once a worker has embedded every input. Its tokens count against the key's
token budget.

Its vectors are not kept past the answer. They may be megabytes: 2,048 vectors of 4,096
floats are 44 MB in Redis. That is a thousand times what the request was charged, and nobody
can fetch them again. Once the answer is sent, or its client has gone, the job is deleted and
its Idempotency-Key freed. A retry with the key while the job runs attaches to it (one job,
one charge). A retry after the answer embeds again. A client that went away is given
CANCEL_GRACE_SECONDS to come back with its key first. The last client attached deletes the job."""

from __future__ import annotations

import logging

import anyio
from redis.exceptions import RedisError
from starlette.responses import Response
from starlette.routing import Route

from api.endpoints.catalog import EMBEDDINGS
from api.endpoints.routes import EndpointRoutes, JobRequest
from api.jobs import reservation
from api.jobs.admission import ModelLimits
from api.jobs.owners import Quota
from api.services import Services
from contract.jobspec import JobSpec

log = logging.getLogger(__name__)

# what `collect` answers a client that went away
GONE = 499


def routes() -> list[Route]:
    return [Route("/v1/embeddings", EmbeddingRoutes(EMBEDDINGS).create, methods=["POST"])]


class EmbeddingRoutes(EndpointRoutes):
    async def answered(
        self, services: Services, job_id: str, ask: JobRequest, response: Response, attached_ms: int
    ) -> None:
        """Delete the job and free its Idempotency-Key, unless another client attached after this
        one. That client is a retry. It deletes the job once it is answered or gone."""
        idempotency = ask.idempotency
        try:
            if idempotency is not None:
                # a retry may come back for it
                if response.status_code == GONE:
                    await anyio.sleep(services.settings.lifetimes.cancel_grace_s)
                job = await services.jobs.state(job_id)
                if job is not None and job.kept_at > attached_ms:
                    return
            await services.jobs.purge(job_id)
            if idempotency is not None:
                await services.jobs.owners.free(idempotency, idempotency.holding(job_id))
        # it expires with its retention anyway
        except RedisError as exc:
            log.warning("could not delete %s once answered: %s", job_id, exc)

    def _quota(self, ask: JobRequest, spec: JobSpec, limits: ModelLimits) -> Quota:
        """Its inputs' tokens are reserved (api/jobs/reservation.py). Token arrays' are reserved
        exactly, strings' as the most they can be."""
        tokens = reservation.prompt_tokens(spec, limits.overhead)
        return Quota(
            unfinished_jobs=ask.services.settings.quotas.max_jobs_per_key,
            budgets=ask.budgets,
            request_bytes=ask.size,
            tokens=tokens,
            prompt_tokens=tokens,
        )
