"""The API's settings for how it runs the pool.

They cover files and the Batch API, cache-aware routing, job lifetimes, and its Redis
connections. They are declared once, as api/settings.py's are. Its `Settings` composes these
groups, and docs/configuration.md is generated from them."""

from __future__ import annotations

from dataclasses import dataclass

from contract.settings import setting


@dataclass(frozen=True)
class Batches:
    """Files and the Batch API."""

    file_max_bytes: int = setting(20_000_000, "FILE_MAX_BYTES", "largest file `POST /v1/files` takes (413)")
    file_retention_s: int = setting(
        7 * 86400,
        "FILE_RETENTION_SECONDS",
        "how long files (batch inputs and outputs) and ended batches are kept",
        minimum=3600,
    )
    batch_max_lines: int = setting(10_000, "BATCH_MAX_LINES", "request lines per batch input file (400)")
    batch_in_flight: int = setting(
        32,
        "BATCH_IN_FLIGHT",
        "lines of one batch queued or running at once (more wait in the batch, not in the queue)",
        minimum=1,
    )
    batch_interval_s: float = setting(
        0.5, "BATCH_INTERVAL_SECONDS", "how often each API process drives the running batches"
    )


@dataclass(frozen=True)
class Routing:
    """Cache-aware routing (api/jobs/routing.py). A new job goes to the worker whose slots
    hold the longest prefix of its prompt. That is weighed against the pool's load."""

    enabled: bool = setting(
        True,
        "PREFIX_ROUTING",
        "`0`: every new job waits in its model's shared queue, whichever worker holds its prompt's "
        "prefix (for comparison)",
    )
    wait_s: float = setting(
        1.0,
        "ROUTE_WAIT_SECONDS",
        "a routed job not taken by its worker within this (more for each job routed there before "
        "it, at most four times as much) goes back to the shared queue",
        minimum=0.05,
    )
    min_chars: int = setting(
        500,
        "ROUTE_MIN_CHARS",
        "a job is routed only for a match of at least this many characters of prompt",
        minimum=1,
    )
    balance_abs: int = setting(
        4,
        "ROUTE_BALANCE_ABS",
        "no routing while the busiest live worker's load (slots in use and jobs routed to it) "
        "exceeds the idlest's by more than this and by ROUTE_BALANCE_REL times",
        minimum=0,
    )
    balance_rel: float = setting(1.5, "ROUTE_BALANCE_REL", "see ROUTE_BALANCE_ABS", minimum=1.0)
    per_key: int = setting(
        8,
        "ROUTED_JOBS_PER_KEY",
        "jobs of one API key that may wait routed to a worker at once; its others wait in the "
        "shared queue, behind every key's earlier jobs (`0`: no limit)",
        minimum=0,
    )


@dataclass(frozen=True)
class Lifetimes:
    """How long a job may wait and run, and how its stream is kept open. Also how dead
    attempts are found."""

    queue_wait_s: float = setting(
        600.0, "QUEUE_WAIT_SECONDS", "a job no worker has started by then ends with `queue_timeout`"
    )
    job_deadline_s: float = setting(
        0.0,
        "JOB_DEADLINE_SECONDS",
        "a job not finished this long after its request ends with `deadline_exceeded`",
        shown="`0` (none)",
    )
    keepalive_s: float = setting(
        15.0, "KEEPALIVE_SECONDS", "keep-alive chunk interval while nothing else is sent"
    )
    cancel_grace_s: float = setting(
        5.0, "CANCEL_GRACE_SECONDS", "a job whose streaming client went away is cancelled after this"
    )
    outage_s: float = setting(
        10.0,
        "STREAM_OUTAGE_SECONDS",
        "a stream whose Redis stays unreachable this long ends with an error",
    )
    worker_stale_s: float = setting(
        15.0, "WORKER_STALE_SECONDS", "a worker silent this long no longer counts for `/v1/models`"
    )
    reaper_interval_s: float = setting(
        0.5, "REAPER_INTERVAL_SECONDS", "how often dead attempts are looked for"
    )
    reaper_settle_s: float = setting(
        5.0,
        "REAPER_SETTLE_SECONDS",
        "no reaping this soon after Redis (re)started; keep it above the workers' reconnect "
        "backoff (2 s), or a live worker still reconnecting is judged dead",
    )


@dataclass(frozen=True)
class Connection:
    """The API's Redis clients."""

    redis_timeout_s: float = setting(5.0, "REDIS_TIMEOUT_SECONDS", "per Redis command")
    redis_pool: int = setting(
        50,
        "REDIS_POOL_SIZE",
        "connections shared by all requests (streams add one reader; on a streams cluster, per node, and a "
        "reader per shard)",
        minimum=1,
    )
    redis_pool_wait_s: float = setting(
        30.0,
        "REDIS_POOL_WAIT_SECONDS",
        "how long a request waits for a pooled connection in a burst before 503",
    )
    replica_ack_s: float = setting(
        1.0,
        "REPLICA_ACK_SECONDS",
        "on a server with replicas, how long a new job waits for one to acknowledge it before it is "
        "answered for (`WAIT`; a failover then cannot lose it); 0: never wait",
        minimum=0.0,
    )
