"""`POST /v1/embeddings`. An embeddings request is a job like a completion, made and admitted
the same way (api/endpoints/routes.py), in the model's embedding pool: its queue, its workers.
It has no stream and no id a client could name again: the answer is the whole list, once a
worker has embedded every input, and the job is deleted once it is sent (its vectors may be
megabytes, and nobody can fetch them again) unless an Idempotency-Key lets a retry ask for
them. Its tokens count against the key's token budget."""

from __future__ import annotations

import logging

from redis.exceptions import RedisError
from starlette.routing import Route

from api.endpoints.routes import Ask, EndpointRoutes
from api.jobs import reservation
from api.jobs.admission import ModelLimits
from api.jobs.owners import Quota
from api.services import Services
from contract.jobspec import JobSpec

log = logging.getLogger(__name__)


class EmbeddingRoutes(EndpointRoutes):
    def routes(self) -> list[Route]:
        return [Route(self.endpoint.path, self.create, methods=["POST"])]

    async def answered(self, services: Services, job_id: str, ask: Ask) -> None:
        if ask.idempotency is None:
            try:
                await services.jobs.purge(job_id)
            except RedisError as exc:  # it expires with its retention anyway
                log.warning("could not delete %s once answered: %s", job_id, exc)

    def _quota(self, ask: Ask, spec: JobSpec, limits: ModelLimits) -> Quota:
        """Its inputs' tokens are reserved: token arrays' exactly, strings' as the most they
        can be (api/jobs/reservation.py)."""
        tokens = reservation.prompt_tokens(spec, limits.overhead)
        return Quota(
            unfinished_jobs=ask.services.settings.quotas.max_jobs_per_key,
            budgets=ask.budgets,
            request_bytes=ask.size,
            tokens=tokens,
            prompt_tokens=tokens,
        )
