"""`POST /v1/rerank`, and the same at `/v2/rerank` (Cohere's ClientV2, vLLM) and `/rerank`
(Jina's and llama-server's other path). A rerank request is a job like an embeddings request,
in the model's rerank pool. It is answered whole once a worker has scored every document. It
is deleted once sent, unless an Idempotency-Key lets a retry ask again. Its pairs' tokens
count against the key's token budget."""

from __future__ import annotations

from starlette.routing import Route

from api.endpoints.catalog import RERANK
from api.endpoints.embeddings.routes import EmbeddingRoutes
from api.endpoints.routes import JobRequest
from api.jobs.admission import ModelLimits
from api.jobs.owners import Quota
from api.jobs.reservation import plain
from contract.jobspec import JobSpec


def pair_tokens(spec: JobSpec, per_pair: int) -> int:
    """The most tokens a rank job's pairs can be. Each pair is a document with the query, counted as
    plain text (api/jobs/reservation.py). To that comes what the worker said its frame around a pair
    adds. The frame is its special tokens, or its rerank template's text."""
    query, *documents = spec.inputs
    assert isinstance(query, str)
    return sum(plain(query) + plain(d) + per_pair for d in documents if isinstance(d, str))


def routes() -> list[Route]:
    rerank = RerankRoutes(RERANK)
    return [
        Route("/v1/rerank", rerank.create, methods=["POST"]),
        Route("/v2/rerank", rerank.create, methods=["POST"]),
        Route("/rerank", rerank.create, methods=["POST"]),
    ]


class RerankRoutes(EmbeddingRoutes):
    def _quota(self, ask: JobRequest, spec: JobSpec, limits: ModelLimits) -> Quota:
        tokens = pair_tokens(spec, limits.overhead.per_part)
        return Quota(
            unfinished_jobs=ask.services.settings.quotas.max_jobs_per_key,
            budgets=ask.budgets,
            request_bytes=ask.size,
            tokens=tokens,
            prompt_tokens=tokens,
        )
