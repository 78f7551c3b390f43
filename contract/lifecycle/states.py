"""The states of a job, and every move between them, as data. An attempt's are in
contract/lifecycle/attempt.py, which uses the types here.

A job's state is where it waits or runs. It is recorded, in a queue, in a worker's inbox, running,
or ended. Each move names the side that makes it and the Lua scripts it runs. Scripts go by module
and name: `queues.TAKE` is contract/lua/queues.py's `TAKE`. A move names the contract function that
runs them, where there is one. It also names the Redis keys it writes. Keys go by their
contract.keys name: `running` is `contract.keys.running`, and `owned.ROUTED` is
`contract.keys.owned(owner, OwnerIndex.ROUTED)`. A test checks that every name here exists.

This module imports nothing of contract/: contract/keys.py derives `JobStatus` from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Side(StrEnum):
    """Who makes a move."""

    # an API process, serving a request or watching a stream
    API = "api"
    # the worker that takes or runs the job
    WORKER = "worker"
    # the API process holding the reaper lock (api/cluster/reaper.py)
    REAPER = "reaper"


@dataclass(frozen=True)
class State:
    """One state, its meaning and keys. A job state names its hash's `status` and the
    contract.tiers function naming its queue. An attempt state names its word in the log."""

    name: str
    meaning: str
    keys: tuple[str, ...] = ()
    status: str = ""
    queue: str = ""
    outcome: str = ""
    ended: bool = False


@dataclass(frozen=True)
class Move:
    """One move, from any of `sources` to one of `targets`, as its scripts decide. With no
    `sources`, it creates. `via` is the contract function that runs them, if any. A move that
    `stays` may also leave the state as it was (a beat while the epoch is current). From a state in
    `keeps` the move is made but leaves the state as it was. (An attempt fenced by another thread
    still ends its work.)"""

    name: str
    sources: tuple[str, ...]
    targets: tuple[str, ...]
    side: Side
    scripts: tuple[str, ...]
    keys: tuple[str, ...]
    meaning: str
    via: str = ""
    stays: bool = False
    keeps: tuple[str, ...] = ()


API, WORKER, REAPER = Side.API, Side.WORKER, Side.REAPER
QUEUED, RUNNING, DONE, FAILED, CANCELLED = "queued", "running", "done", "failed", "cancelled"
ENDS = ("job", "events")

PENDING = State(
    "pending",
    "Recorded but on no queue yet: its enqueuer puts it on one, or the reaper does if that one died.",
    ("job", "pending"),
    QUEUED,
)
WAITING = State(
    "queued",
    "A new job waiting in its model's queue of its tier for any worker with a free slot.",
    ("rq_job", "wake"),
    QUEUED,
    "queue_name",
)
ROUTED = State(
    "routed",
    "A new job waiting, until a deadline, for the worker whose cache holds its prompt's prefix.",
    ("rq_job", "routed", "owned.ROUTED", "wake_worker"),
    QUEUED,
    "routed_queue_name",
)
CONTINUATION = State(
    "continuation",
    "Requeued after an attempt, ahead of new jobs, to go on from the token ids its stream holds.",
    ("rq_job", "wake"),
    QUEUED,
    "attempt_queue_name",
)
SUSPECT = State(
    "suspect",
    "A continuation that stood still where workers died, to step in a group no larger than its own.",
    ("rq_job", "wake"),
    QUEUED,
    "suspect_queue_name",
)
TAKEN = State(
    "taken",
    "In a worker's inbox, not yet claimed: the reaper puts it back if that worker dies.",
    ("inbox",),
    QUEUED,
)
RUNNING_JOB = State(
    "running",
    "An attempt holds it at the job's current epoch, alive while its heartbeat is.",
    ("job", "alive", "running"),
    RUNNING,
)
DONE_JOB = State("done", "Ended with its Finished entry, kept for its retention.", ENDS, DONE, ended=True)
FAILED_JOB = State(
    "failed", "Ended with a Failed entry (an error of the catalogue).", ENDS, FAILED, ended=True
)
CANCELLED_JOB = State(
    "cancelled",
    "Ended by a cancel or a client gone, with a Finished entry whose reason is `cancelled`.",
    ENDS,
    CANCELLED,
    ended=True,
)

WAITS = (PENDING, WAITING, ROUTED, CONTINUATION, SUSPECT, TAKEN)
JOB_STATES = (*WAITS, RUNNING_JOB, DONE_JOB, FAILED_JOB, CANCELLED_JOB)
# all of status queued
WAITING_STATES = tuple(s.name for s in WAITS)
# a job hash's `status`, in order
STATUSES = tuple(dict.fromkeys(s.status for s in JOB_STATES))
ENDED_STATUSES = tuple(s.status for s in JOB_STATES if s.ended)

# ABANDON, then enqueue
TAKEN_BACK = ("job", "running", "alive", "pending", "rq_job", "wake", "STATS")

JOB_MOVES = (
    Move(
        "record",
        (),
        ("pending",),
        API,
        ("queues.RESERVE", "accounting.ADMIT", "jobs.RECORD"),
        (
            "reserved",
            "owned.JOBS",
            "idempotency",
            "requests_per_minute",
            "bytes_per_minute",
            "tokens_per_minute",
            "owned.RESERVED_TOKENS",
            "job",
            "pending",
        ),
        "Hold a place in the queues, count the job against its owner's limits, record its hash.",
    ),
    Move(
        "enqueue",
        ("pending",),
        ("queued",),
        API,
        (),
        ("rq_job", "wake", "reserved", "pending"),
        "Put the new job on its tier's queue and wake an idle worker.",
        "queueing.enqueue",
    ),
    Move(
        "route",
        ("pending",),
        ("routed",),
        API,
        ("queues.ROUTE_FOR_OWNER",),
        ("owned.ROUTED", "rq_job", "routed", "wake_worker", "reserved", "pending"),
        "Put the new job on the routed queue of the worker holding its prompt's prefix.",
        "queueing.enqueue",
    ),
    Move(
        "rescue",
        ("pending",),
        ("queued", "continuation", "suspect"),
        REAPER,
        (),
        ("rq_job", "wake", "pending"),
        "Enqueue a job pending for over PENDING_GRACE_S: whoever was to enqueue it died.",
        "queueing.rescue",
    ),
    Move(
        "fall back",
        ("routed",),
        ("queued",),
        REAPER,
        ("queues.FALL_BACK",),
        ("routed", "wake", "STATS"),
        "Move a routed job its worker did not take in time (or died with) back to the shared queue.",
    ),
    Move(
        "take",
        ("queued", "routed", "continuation", "suspect"),
        ("taken",),
        WORKER,
        ("queues.TAKE",),
        ("inbox",),
        "A worker with a free slot moves one job id from its queues, in their order, to its inbox.",
    ),
    Move(
        "put back",
        ("taken",),
        ("queued", "continuation", "suspect"),
        REAPER,
        (),
        ("inbox", "wake"),
        "Queue again what a dead worker took and never claimed (a transaction: api/jobs/store.py).",
    ),
    Move(
        "claim",
        ("taken",),
        ("running", "failed"),
        WORKER,
        ("attempts.CLAIM",),
        ("job", "alive", "running", "pending"),
        "Start an attempt at the next epoch, or fail a new job past its start deadline (queue_timeout).",
    ),
    Move(
        "refuse",
        ("taken",),
        ("failed",),
        WORKER,
        ("jobs.END",),
        ENDS,
        "End a job this worker cannot run (another model's, or a claim Redis refused).",
    ),
    Move(
        "finish",
        ("running",),
        ("done", "failed", "cancelled"),
        WORKER,
        ("attempts.APPEND", "attempts.FAIL"),
        ("events", "job", "running", "alive"),
        "The attempt writes the terminal entry (FAIL a small one when a full Redis refused its own).",
    ),
    Move(
        "cancel",
        WAITING_STATES,
        ("cancelled",),
        API,
        ("jobs.END",),
        ("job", "events", "pending"),
        "End a job still waiting at once, fencing out the attempt that would have run it.",
    ),
    Move(
        "stop",
        ("running",),
        ("cancelled",),
        WORKER,
        ("attempts.APPEND",),
        ("job", "events", "running", "alive"),
        "The API sets `cancel_at`, APPEND's reply tells the attempt, which writes Finished(cancelled).",
    ),
    Move(
        "time out",
        WAITING_STATES,
        ("failed",),
        API,
        ("jobs.END_IF_LATE",),
        ("job", "events", "pending"),
        "End a job not (re)started by its deadline: queue_timeout, or worker_lost after an attempt.",
    ),
    Move(
        "reap",
        ("running",),
        ("continuation", "suspect", "failed"),
        REAPER,
        ("jobs.INDEXES", "queues.DEAD_BATCH", "jobs.ABANDON"),
        TAKEN_BACK,
        "Take the job from a dead attempt: requeue it (a suspect if it stood still) or fail it.",
        "queueing.abandon",
    ),
    Move(
        "hand off",
        ("running",),
        ("continuation",),
        WORKER,
        ("jobs.ABANDON",),
        TAKEN_BACK,
        "Give the job back uncharged: the worker shuts down, or preempts a batch line.",
        "queueing.abandon",
    ),
)
