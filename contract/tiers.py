"""Job tiers, and the RQ queues a job waits in, by name.

A model has one queue per tier, one per worker for the jobs routed to it, and the suspects'.
Their Redis keys are in contract/keys.py."""

from __future__ import annotations

PRIORITIES = ("priority", "default", "flex", "batch")
"""Job tiers, in the order a worker takes them: the service tiers a request may ask for
(OpenAI's `service_tier`: the first three), then the Batch API's lines, which a worker takes
only into its batch slots (BATCH_SLOTS). Each has its own queue per model, `default` the
model's own name."""
BATCH = "batch"


EMBEDDINGS = "#embed"


def embedding_pool(model: str) -> str:
    """The pool that serves a model's embeddings.

    It has its own workers and queues, apart from the model's chat workers. A GGUF may be
    served by both (docs/embeddings.md). Everything keyed by a model (queues, registry, stats,
    scaling) is keyed by this name for embeddings."""
    return model + EMBEDDINGS


RANK = "#rank"


def rank_pool(model: str) -> str:
    """The pool that serves a model's reranking (`/v1/rerank`).

    Its workers run a reranker's GGUF (rank pooling). It is keyed by this name, as an embedding
    pool is by its own."""
    return model + RANK


JOB_KINDS = {"chat": ("chat", "text"), "embeddings": ("embed",), "rerank": ("rank",)}
"""The job kinds (contract.jobspec.KINDS) a pool of each kind runs."""


def served_model(pool: str) -> tuple[str, str]:
    """(model name, kind) of a pool.

    It is ("m", "embeddings") for `embedding_pool("m")`, and ("m", "rerank") for
    `rank_pool("m")`. Else it is (pool, "chat")."""
    if pool.endswith(EMBEDDINGS):
        return pool.removesuffix(EMBEDDINGS), "embeddings"
    if pool.endswith(RANK):
        return pool.removesuffix(RANK), "rerank"
    return pool, "chat"


def queue_name(model: str, priority: str = "default") -> str:
    """The RQ queue a model's new jobs of one tier wait in."""
    return model if priority == "default" else f"{model}#{priority}"


def attempt_queue_name(model: str, priority: str, *, continuation: bool, suspect: bool) -> str:
    """The queue an attempt waits in.

    A suspect's waits in the suspect queue. A continuation's waits in the first tier's,
    whatever its own. Its client is mid-stream, and its resume has a deadline. But a batch
    line's stays in the batch queue. No client waits on it, and a worker takes batch lines only
    into its batch slots. A new job's waits in its tier's."""
    if suspect:
        return suspect_queue_name(model)
    return queue_name(model, PRIORITIES[0] if continuation and priority != BATCH else priority)


ROUTED_TIERS = PRIORITIES[:3]
"""The tiers a new job may be routed in (api/jobs/routing.py): interactive ones. Batch lines,
suspects and continuations wait in the model's shared queues, as they always did."""


def routed_queue_name(model: str, priority: str, worker: str) -> str:
    """The RQ queue of a model's jobs of one tier routed to one worker.

    That worker holds their prompt's prefix in its cache. It takes from this queue before the
    shared queue of the same tier. A job it does not take by its deadline goes back to that
    shared queue (`routed`)."""
    return f"{queue_name(model, priority)}@{worker}"


def worker_queue_names(model: str, worker: str) -> tuple[str, ...]:
    """The queues one worker takes from, in order.

    The suspect queue comes first. Then each tier's own routed queue comes before that tier's
    shared one. The batch queue comes last."""
    routed = [(routed_queue_name(model, p, worker), queue_name(model, p)) for p in ROUTED_TIERS]
    return (suspect_queue_name(model), *(n for pair in routed for n in pair), queue_name(model, BATCH))


def suspect_queue_name(model: str) -> str:
    """The RQ queue of a model's jobs that stood still where workers died.

    A worker runs as many at once as their groups allow (see contract.lua.jobs.ABANDON)."""
    return f"{model}#suspect"


def queue_names(model: str) -> tuple[str, ...]:
    """Every queue of a model, in the order workers take from them."""
    return (suspect_queue_name(model), *(queue_name(model, p) for p in PRIORITIES))


def routed_member(rq_job_id: str, worker: str, priority: str) -> str:
    """A `routed` entry: the RQ job, the worker it waits for, its tier.

    Worker names, like Redis connection names, hold no spaces."""
    return f"{rq_job_id} {worker} {priority}"


def parse_routed_member(member: str) -> tuple[str, str, str]:
    """(RQ job id, worker, tier) of a `routed` entry."""
    job_id, worker, priority = member.split(" ")
    return job_id, worker, priority
