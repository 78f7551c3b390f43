"""Every Redis key tokenspool uses, in one place, and which server holds it.

Two servers, which may be one (docs/operations.md, "Two Redis servers"):

- The **streams** server (STREAMS_REDIS_URL, by default REDIS_URL) holds each job's keys. They are
  `job`, `events` and `alive`. It also holds the indexes the per-job scripts keep with them (`running`,
  `pending`). The API processes' `hub_control` streams are there too. Every token goes there.
- The **queues** server (REDIS_URL) holds everything else. That is RQ's queues and records, the worker
  registry, and the stats. Files, batches, and what each API key's owner holds and spends live there too.

Every key of the streams server carries a hash tag (`{...}`) naming one of `SHARDS` shards.
Every script there touches one shard's keys only. So the streams server may be a Redis
Cluster. A job's keys and its shard's indexes share a slot. RQ's own keys (`rq:queue:<name>`,
`rq:job:<id>`, ...) are RQ's business. Their names are contract/tiers.py's.
"""

from __future__ import annotations

import zlib
from enum import StrEnum

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from rq import Queue
from rq.worker_registration import WORKERS_BY_QUEUE_KEY

from contract.lifecycle import states
from contract.tiers import BATCH, queue_name, queue_names

PREFIX = "ts"

SHARDS = 32
"""How many shards the streams server's keys fall into. A job's shard is fixed by its id;
the reaper reads each shard's indexes, and on a cluster an API process reads each shard's
streams over a connection of its own. Changing it orphans the unfinished jobs."""


def _tag(shard: int) -> str:
    """The hash tag of a shard. Each shard owns an even share of the slots. Its tag is the first of `0-0`,
    `0-1`, ... whose slot lies in that share. So shards spread over a cluster's nodes as its slots do."""
    share = REDIS_CLUSTER_HASH_SLOTS // SHARDS
    n = 0
    while key_slot(f"{shard}-{n}".encode()) // share != shard:
        n += 1
    return f"{shard}-{n}"


TAGS = tuple(_tag(i) for i in range(SHARDS))


def shard(job_id: str) -> int:
    """The shard a job's keys are in."""
    return zlib.crc32(job_id.encode()) % SHARDS


_SHARD_OF_TAG = {tag: i for i, tag in enumerate(TAGS)}


def shard_of_key(key: str) -> int:
    """The shard of a streams-server key (any key carrying a shard's hash tag)."""
    return _SHARD_OF_TAG[key[key.index("{") + 1 : key.index("}")]]


# The only function a worker will execute; the API enqueues it by this name (a wire name, kept
# across releases): the worker checks it and calls worker/attempts/runner.py, never importing by it.
JOB_FUNCTION = "worker.runner.generate"


def _in_shard(job_id: str, what: str) -> str:
    return f"{PREFIX}:{{{TAGS[shard(job_id)]}}}:{what}:{job_id}"


def job(job_id: str) -> str:
    """HASH (streams): the job's state (see `JobField`)."""
    return _in_shard(job_id, "job")


def events(job_id: str) -> str:
    """STREAM (streams): the job's events, in order (see `contract.entries`)."""
    return _in_shard(job_id, "events")


def alive(job_id: str) -> str:
    """STRING (streams): the current attempt's epoch, kept alive by its worker's heartbeat (PX)."""
    return _in_shard(job_id, "alive")


_CONTINUATION = "__a"  # never in a job id: their random part is letters and digits


def rq_job_id(job_id: str, epoch: int) -> str:
    """The RQ job id of a job queued at `epoch`. It is the job id for the first attempt, and a
    continuation id after a requeue. (RQ ids allow letters, digits, '_' and '-'.)"""
    return job_id if epoch == 0 else f"{job_id}{_CONTINUATION}{epoch}"


def job_of(rq_job_id: str) -> str:
    """The job id an RQ job id belongs to (see `rq_job_id`)."""
    return rq_job_id.split(_CONTINUATION, 1)[0]


def running(shard: int) -> str:
    """ZSET (streams): job id -> ms its current attempt started, one shard's. The reaper watches it."""
    return f"{PREFIX}:{{{TAGS[shard]}}}:running"


def pending(shard: int) -> str:
    """ZSET (streams), one shard's: job id -> ms since it is queued. A job is in it from its record or
    requeue until it is known to be on an RQ queue. The reaper enqueues what stays too long."""
    return f"{PREFIX}:{{{TAGS[shard]}}}:pending"


def inbox(worker: str) -> str:
    """HASH: RQ job id -> ms when taken, for the jobs a worker took from its queues (`TAKE`). It holds
    those the worker has not yet claimed or refused. The reaper puts back a dead worker's."""
    return f"{PREFIX}:inbox:{worker}"


def wake(model: str) -> str:
    """LIST: one token per enqueued job of `model`; idle workers block on it."""
    return f"{PREFIX}:wake:{model}"


def wake_worker(worker: str) -> str:
    """LIST: a token when one of the worker's Batch API lines ends. The worker then takes the next line
    at once. It blocks on this list beside `wake`. Expires a minute after the last token."""
    return f"{PREFIX}:wake-worker:{worker}"


def dead_worker(worker: str) -> str:
    """STRING: the jobs a worker held when the reaper found it dead (for 15 s). Its attempts found dead
    in later ticks are judged with the same batch."""
    return f"{PREFIX}:dead:{worker}"


def dead_suspects(worker: str) -> str:
    """STRING: as `dead_worker`, its uncleared suspects: the group they stepped in."""
    return f"{PREFIX}:dead:{worker}:suspects"


def callback(rq_job_id: str) -> str:
    """STRING: the worker that preempts a batch line for this interactive job (SET NX PX)."""
    return f"{PREFIX}:callback:{rq_job_id}"


def reserved(model: str) -> str:
    """ZSET: places held in a model's queues by requests about to enqueue (RESERVE)."""
    return f"{PREFIX}:reserved:{model}"


def requests_per_minute(owner: str, minute: int) -> str:
    """STRING: the jobs one API key's owner created in one minute (since the epoch)."""
    return f"{PREFIX}:rate:{owner}:{minute}"


def bytes_per_minute(owner: str, minute: int) -> str:
    """STRING: the request bytes one API key's owner sent in one minute."""
    return f"{PREFIX}:bytes:{owner}:{minute}"


def tokens_per_minute(owner: str, minute: int) -> str:
    """STRING: the tokens one API key's owner is charged in one minute (ADMIT, SETTLE)."""
    return f"{PREFIX}:tokens:{owner}:{minute}"


def context(model: str) -> str:
    """HASH: worker name -> its context per job (N_CTX), set with each announcement. And LAST_CONTEXT ->
    the last one, kept when the pool scaled to zero. It bounds prompts."""
    return f"{PREFIX}:ctx:{model}"


def prompt_overhead(model: str) -> str:
    """HASH: as `context`, what each worker's chat template adds to a prompt (contract/prefixes.py)."""
    return f"{PREFIX}:overhead:{model}"


LAST_CONTEXT = "*last"  # a field of `context` and `prompt_overhead`: no worker name starts with '*'


def idempotency(owner: str, digest: str) -> str:
    """STRING (queues): "<job id> <request digest>" for a request made with an Idempotency-Key. The
    request is one API key's owner's. `digest` is the Idempotency-Key's SHA-256."""
    return f"{PREFIX}:idem:{owner}:{digest}"


REAPER_LOCK = f"{PREFIX}:reaper"
"""STRING: which API process currently looks for dead attempts (SET NX PX)."""
REASONING_SEAL = f"{PREFIX}:reasoning-seal"  # STRING: the Responses' sealing secret, if made (SET NX)
ACK_MARK = f"{PREFIX}:acks"
"""STRING (each server): a counter the API increments so that `WAIT` has a write of its own
to wait for: a replica holding it holds every write before it (api/jobs/acks.py)."""


def ack_mark_beside(key: str) -> str:
    """STRING (a streams cluster's primaries): `ACK_MARK` in the slot of `key`, on its primary."""
    if "{" not in key or "}" not in key:
        return ACK_MARK
    return f"{PREFIX}:{key[key.index('{') : key.index('}') + 1]}:acks"


def file(file_id: str) -> str:
    """HASH: a file's metadata (api/batches/files.py); older files hold their `content` here too."""
    return f"{PREFIX}:file:{file_id}"


def file_content(file_id: str) -> str:
    """STRING: a file's content (an output file's is appended in pieces as it is written)."""
    return f"{PREFIX}:file:{file_id}:content"


class OwnerIndex(StrEnum):
    """The indexes of what one API key's owner holds: `owned(owner, OwnerIndex.X)` names each."""

    JOBS = "jobs"
    """ZSET: its jobs that may not have ended (job id -> created ms), for MAX_JOBS_PER_KEY:
    ADMIT adds; ended ones go when an ADMIT finds the owner at the limit, and by age."""
    FILES = "files"
    """ZSET: the owner's files (id -> created, s), for listing."""
    FILE_SIZES = "filesizes"
    """HASH: what it is charged for keeping, for FILES_BYTES_PER_KEY: its files and its running
    batches' lines and answers (id -> "<bytes> <expires at, s>")."""
    FILE_EXPIRY = "fileexpiry"
    """ZSET: the same charges by when they expire (id -> s)."""
    FILE_HELD = "fileheld"
    """STRING: the sum of the owner's charges, in bytes."""
    BATCHES = "batches"
    """ZSET: the owner's batches (id -> created, ms), for listing."""
    RUNNING_BATCHES = "running"
    """ZSET: the owner's batches not yet ended (id -> created, ms), for MAX_BATCHES_PER_KEY."""
    RESERVED_TOKENS = "reservedtokens"
    """HASH: unsettled token reservations, job id -> "<minute> <reserved> <prompt's bound>"."""
    ROUTED = "routed"
    """ZSET: its jobs routed to a worker (`routed` members -> ms when), for ROUTED_JOBS_PER_KEY."""


def owned(owner: str, index: OwnerIndex) -> str:
    return f"{PREFIX}:owner:{owner}:{index}"


class BatchPart(StrEnum):
    """The keys of one batch (api/batches/routes.py, api/batches/driver.py): `batch(id, BatchPart.X)`."""

    STATE = ""  # HASH: its status, timestamps, counts and files (`ts:batch:<id>`)
    LINES = "lines"  # LIST: its request lines (JSON), in input order
    OPEN = "open"  # HASH: its lines sent as jobs and not yet answered: line number -> job id
    RESULTS = "results"  # HASH: its answered lines: line number -> its output line (JSON), written once


def batch(batch_id: str, part: BatchPart = BatchPart.STATE) -> str:
    return f"{PREFIX}:batch:{batch_id}" + (f":{part}" if part else "")


BATCH_DRIVER_LOCK = f"{PREFIX}:batches:driver"  # STRING: the API process driving the batches (one at a time)
ACTIVE_BATCHES = f"{PREFIX}:batches"  # ZSET: the batches not yet ended (id -> created, ms)

WORKER_CONNECTION_PREFIX = "tsworker:"
"""Every connection a worker opens is named this + its worker name (CLIENT SETNAME): a
process that died is seen at once, the kernel closing its sockets."""


def workers(model: str) -> str:
    """ZSET: worker name -> last announcement (ms since the epoch) for one model."""
    return f"{PREFIX}:workers:{model}"


def worker_slots(model: str) -> str:
    """HASH: worker name -> how many jobs it runs at once (SLOTS), set with each announcement. Fields of
    workers that stopped announcing are dropped with their `workers` entry."""
    return f"{PREFIX}:slots:{model}"


def starting_workers(model: str) -> str:
    """ZSET: worker name -> when it last said it is starting (ms). A starting worker is fetching, loading
    or warming its model, and is not yet in `workers`. It is capacity coming (api/cluster/resumes.py)."""
    return f"{PREFIX}:starting:{model}"


def held_prefixes(worker: str) -> str:
    """SET: the prompt prefixes (contract/prefixes.py digests) the worker's slots hold. Its announcements
    keep it alive. It is deleted when the worker stops or is found dead."""
    return f"{PREFIX}:held:{worker}"


def worker_load(model: str) -> str:
    """HASH: worker name -> "<slots in use> <mean step ms> <prompt tokens> <of them cached>". The figures
    count since the worker started. It is set with each announcement, for routing and the pool view."""
    return f"{PREFIX}:load:{model}"


def routed(model: str) -> str:
    """ZSET: `contract.tiers.routed_member`s -> ms by which the worker must have taken the job. An entry is
    written with the job's push onto the routed queue. Past it, the job goes back to the shared queue."""
    return f"{PREFIX}:routed:{model}"


def worker_vision(model: str) -> str:
    """HASH: worker name -> the most tokens an image becomes. It is set with each announcement of a
    worker reading images (MMPROJ_PATH). Empty: no worker of the model has vision."""
    return f"{PREFIX}:vision:{model}"


def image(scope: str, sha256: str) -> str:
    """STRING: an image's bytes by their SHA-256 within a cache scope. Kept with its job (contract/media/)."""
    return f"{PREFIX}:image:{scope}:{sha256}"


def worker_placement(model: str) -> str:
    """HASH: worker name -> "<GPU layers> <KV cache bytes>", set with each announcement."""
    return f"{PREFIX}:placement:{model}"


def hub_control(process: str, shard: int) -> str:
    """STREAM (streams): wakes one API process's reader of one shard's streams. It wakes the reader when
    its set of watched streams grows. On a single server one reader reads every shard: shard 0's."""
    return f"{PREFIX}:{{{TAGS[shard]}}}:hub:{process}"


STATS = f"{PREFIX}:stats"
"""HASH: cluster-wide counters, for /metrics (see contract.stats.StatField)."""

MODELS = f"{PREFIX}:models"
"""SET: every model name a worker has ever announced (`workers(model)`: whether one still does)."""


def rq_queue_key(name: str) -> str:
    """LIST: RQ's own key for the queue named `name`."""
    return Queue.redis_queue_namespace_prefix + name


def rq_queue_workers_key(name: str) -> str:
    """SET: RQ's registry of the workers reading queue `name`. A routed queue's goes with its worker."""
    return WORKERS_BY_QUEUE_KEY % name


def queue_key(model: str) -> str:
    """LIST: a model's waiting new jobs (RQ's own key for `queue_name(model)`)."""
    return rq_queue_key(queue_name(model))


def queue_keys(model: str) -> list[str]:
    """The lists of every queue of a model (`queue_names`, in order)."""
    return [rq_queue_key(name) for name in queue_names(model)]


def interactive_queue_keys(model: str) -> list[str]:
    """The lists of a model's queues but the Batch API's. MAX_QUEUE_DEPTH bounds what waits in these.
    Batch lines are bounded by BATCH_IN_FLIGHT, and never keep interactive ones out."""
    return [rq_queue_key(name) for name in queue_names(model) if name != queue_name(model, BATCH)]


def rq_job(rq_job_id: str) -> str:
    """HASH: RQ's record of an enqueued job. A worker only ever reads its `data`. A suspect's record also
    holds its `JobField.GROUP`, for TAKE."""
    return "rq:job:" + rq_job_id


class JobField:
    """Field names of the job HASH."""

    MODEL = "model"
    SURFACE = "surface"  # the endpoint that created it ("chat", "text", ...): api.endpoints.catalog
    CREATED = "created"  # unix seconds, stamped by the API into every chunk
    STATUS = "status"  # see JobStatus
    EPOCH = "epoch"  # fencing token; only the attempt holding the current epoch may write
    ATTEMPTS = "attempts"  # attempts started so far
    ENDED = "ended"  # "1" once a terminal entry is in the stream
    WORKER = "worker"  # name of the worker running the current attempt
    CANCEL_AT = "cancel_at"  # ms since the epoch after which the job must stop
    KEPT_AT = "kept_at"  # ms since the epoch when a client last attached again (a resume, a retry)
    START_BY = "start_by"  # ms since the epoch: a job still queued then is never (re)started
    WAIT_UNTIL = "wait_until"  # ms: a requeue may wait for a slot this long (a batch line: its window)
    SPEC = "spec"  # the JobSpec as JSON, as enqueued
    DIGEST = "digest"  # the spec's digest (contract.jobspec.digest): CLAIM runs no other spec
    KEEP_SPEC = "keep_spec"  # "1": the spec stays after the end (an endpoint shows it later)
    OWNER = "owner"  # hash of the API key that created the job ("" without keys)
    IDEMPOTENCY = "idem"  # the job's idempotency key (contract.keys.idempotency), if any
    CLAIM = "claim"  # the token of the claim that started the current attempt (retries repeat it)
    SEQ = "seq"  # entries the current attempt has written (APPEND skips what it already wrote)
    CHARGED = "charged"  # deaths in a row charged to the job (it stood still, alone or the suspect)
    # times the job was taken from a worker standing still (deaths and hand-offs, not preemptions)
    REQUEUES = "requeues"
    STALLS = "stalls"  # deaths in a row at which the job stood still (contract.lua.jobs.ABANDON)
    # "1": it stood still at two deaths in a row (at one, alone): it steps with its worker's
    # suspects, apart from jobs reading, until it has gone SUSPECT_TOKENS on, then cleared
    SUSPECT = "suspect"
    GROUP = "group"  # the most suspects it may step with, halved at each death among them
    USAGE = "usage"  # "1" if the stream includes the usage chunk (stream_options)
    DETACHED = "detached"  # "1" for background jobs: a disconnect never cancels them
    DEADLINE = "deadline"  # ms since the epoch: a job still generating then fails (optional)
    PRIORITY = "priority"  # its tier (contract.tiers.PRIORITIES): which queue its attempts wait in
    # Written by the API for its own later use; workers never read them.
    ECHO = "echo"  # JSON: what a response repeats of its request (api/endpoints/responses/body.py)
    INPUT = "input"  # JSON: a response's input items, with their ids (GET .../input_items)
    REASONING = "think_as"  # chat: its thinking's field if not `reasoning_content` (REASONING_FIELD)


class JobStatus:
    """A job hash's `status`, as contract/lifecycle/states.py's job states show it."""

    QUEUED, RUNNING, DONE, FAILED, CANCELLED = states.STATUSES
    ENDED = states.ENDED_STATUSES
