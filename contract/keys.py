"""Every Redis key tokenspool uses, in one place.

Per-job keys carry the completion id in a hash tag (`{...}`) so that the job hash and its
stream always land in one Redis Cluster slot, as the Lua scripts touching both require.
RQ's own keys (`rq:queue:<model>`, `rq:job:<id>`, ...) are RQ's business; tokenspool only
decides the queue name, which is the model name.
"""

from __future__ import annotations

from dataclasses import dataclass

from rq import Queue

PREFIX = "ts"

# The only function a tokenspool worker will execute; the API enqueues it by this path.
JOB_FUNCTION = "worker.runner.generate"


def job(completion_id: str) -> str:
    """HASH: the job's state (see `JobField`)."""
    return f"{PREFIX}:{{{completion_id}}}:job"


def events(completion_id: str) -> str:
    """STREAM: the job's events, in order (see `contract.entries`)."""
    return f"{PREFIX}:{{{completion_id}}}:events"


def alive(completion_id: str) -> str:
    """STRING: the current attempt's epoch, kept alive by its worker's heartbeat (PX)."""
    return f"{PREFIX}:{{{completion_id}}}:alive"


def continuation_job_id(completion_id: str, attempt: int) -> str:
    """RQ job id of a resumed attempt (RQ ids allow letters, digits, '_' and '-')."""
    return f"{completion_id}-a{attempt}"


RUNNING = f"{PREFIX}:running"
"""ZSET: completion id -> ms when its current attempt started; what the reaper watches."""

REAPER_LOCK = f"{PREFIX}:reaper"
"""STRING: which API process currently looks for dead attempts (SET NX PX)."""

WORKER_CONNECTION_PREFIX = "tsworker:"
"""Every connection a worker opens is named this + its worker name (CLIENT SETNAME), so
that a process that died is seen at once: the kernel closes its sockets."""


def workers(model: str) -> str:
    """ZSET: worker name -> last announcement (ms since the epoch) for one model."""
    return f"{PREFIX}:workers:{model}"


def worker_slots(model: str) -> str:
    """HASH: worker name -> how many jobs it runs at once (SLOTS), set with each announcement;
    fields of workers that stopped announcing are dropped with their `workers` entry."""
    return f"{PREFIX}:slots:{model}"


def hub_control(process: str) -> str:
    """STREAM: wakes one API process's stream reader when its set of watched streams grows."""
    return f"{PREFIX}:hub:{process}"


def owner_jobs(owner: str) -> str:
    """ZSET: the jobs one API key created that may not have ended (completion id -> created
    ms), for the per-key job limit; ended ones are pruned when counted."""
    return f"{PREFIX}:owner:{owner}:jobs"


STATS = f"{PREFIX}:stats"
"""HASH: cluster-wide counters, for /metrics (see `StatField`)."""


class StatField:
    """Field names of the STATS hash."""

    @staticmethod
    def tokens(model: str) -> str:
        """Tokens generated for `model`, by every attempt of every job."""
        return f"tokens:{model}"

    @staticmethod
    def requeued(reason: str) -> str:
        """Attempts taken over by another worker: reason "crash" (found dead by the reaper)
        or "handoff" (a worker shutting down gave its job back)."""
        return f"requeued:{reason}"

    LOST = "lost"  # jobs ended with worker_lost once their attempts were used up

    @staticmethod
    def batch(counter: str, model: str) -> str:
        """One of `BatchCounters`, summed over `model`'s workers."""
        return f"batch:{counter}:{model}"


@dataclass
class BatchCounters:
    """What a worker's batching scheduler has done; each announcement adds what changed
    since the last one to STATS (`StatField.batch`), so a killed worker loses at most one
    announcement's worth."""

    steps: int = 0  # llama_decode calls
    sequences: int = 0  # sequences in those calls, summed: mean occupancy = sequences / steps
    prefill_tokens: int = 0  # prompt tokens computed (a resumed job's earlier tokens included),
    # not counting those its slot's cache already held
    moves: int = 0  # sequences moved to close a gap between slots (worker.batching.compaction)


MODELS = f"{PREFIX}:models"
"""SET: every model name a worker has ever announced (whether one still serves it is
`workers(model)`'s business)."""


def queue_name(model: str) -> str:
    """The RQ queue a model's jobs wait in: the model's own name."""
    return model


def queue_key(model: str) -> str:
    """LIST: a model's waiting jobs (RQ's own key for `queue_name(model)`)."""
    return Queue.redis_queue_namespace_prefix + queue_name(model)


class JobField:
    """Field names of the job HASH."""

    MODEL = "model"
    SURFACE = "surface"  # the API surface that created it ("chat", "text"): api.surfaces
    CREATED = "created"  # unix seconds, stamped by the API into every chunk
    STATUS = "status"  # see JobStatus
    EPOCH = "epoch"  # fencing token; only the attempt holding the current epoch may write
    ATTEMPTS = "attempts"  # attempts started so far
    ENDED = "ended"  # "1" once a terminal entry is in the stream
    WORKER = "worker"  # name of the worker running the current attempt
    CANCEL_AT = "cancel_at"  # ms since the epoch after which the job must stop
    START_BY = "start_by"  # ms since the epoch: a job still queued then is never (re)started
    SPEC = "spec"  # the JobSpec as JSON, as enqueued
    OWNER = "owner"  # hash of the API key that created the job ("" without keys)
    USAGE = "usage"  # "1" if the stream includes the usage chunk (stream_options)
    DETACHED = "detached"  # "1" for background jobs: a disconnect never cancels them
    DEADLINE = "deadline"  # ms since the epoch: a job still generating then fails (optional)


class JobStatus:
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"  # ended by a cancel (or a client gone), whatever it had generated

    ENDED = (DONE, FAILED, CANCELLED)
