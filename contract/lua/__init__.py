"""Every Lua script tokenspool runs, by the server and the part that runs it: the job-stream
scripts (library.py, attempts.py, jobs.py) apart from the queues' (queues.py) and the
accounting (accounting.py). Each is the only way its keys are written.

Each script runs atomically in Redis, so "is this attempt still the current one, has the job
ended, should it stop" is checked in the same step as the write:

- `ADMIT` counts a new job against its key's owner (queues server): refused when the owner
  already has the most unfinished jobs allowed or is over its request rate, byte or token
  budget, or when its Idempotency-Key names another job (then that job's id is returned). Checking a
  limit and counting the job against it are one step, so concurrent requests on any
  replicas cannot overshoot it. An ended job leaves its owner's count when a later ADMIT
  finds the owner at the limit (api/jobs/owners.py): the scripts that end a job run on the
  streams server and cannot reach the queues server's count.
- `SETTLE` turns an ended job's reserved tokens into the tokens it used, once (queues
  server; the API that reads its end, or the owner's next ADMIT that finds it short).
- `RECORD` records an admitted job (streams server). The job is pending until its enqueuer
  says it is on an RQ queue.
- `RESERVE` holds a place in a model's queues for a new request, unless they are full.
- `TAKE` moves one job id from a model's queues (in priority order) into the taking
  worker's inbox, so that a worker that dies before claiming it loses nothing; of the
  suspects, the first whose group allows one more beside the worker's own.
- `CLAIM` starts an attempt: bumps the epoch (fencing out every earlier attempt), counts the
  attempt, marks the job running and alive, unless the job has ended; a new job that waited
  past its start deadline is ended instead (`END_IF_LATE`'s rule; a requeued one a worker
  takes is not late: api/cluster/resumes.py). A retried claim (the same
  token, its reply lost) returns the same attempt. Returns the epoch, whether a cancel is
  due, and whether the job is a suspect, with its group.
- `APPEND` writes one or more entries of an attempt (a worker batches what piled up while
  its previous write was in flight): refused with a `FENCED` error unless the epoch is
  current and the job has not ended; a terminal entry marks the job ended and starts its
  retention. Each attempt numbers its entries, and a retried APPEND (its reply lost) skips
  those already written: nothing is published twice. Returns the cancel flag, so a worker
  learns of a cancel on the write it makes anyway, and each entry's stream id. After a
  failover that lost the attempt's last writes (docs/protocol.md, "Failover"), it answers
  `BEHIND n` and the worker writes the lost entries again with the ids they had; an attempt
  whose claim was lost claims again (its epoch is above the job's: epochs only grow).
- `BEAT` is the attempt's heartbeat: refreshes its liveness key while the epoch is current;
  returns 0 once it is not, so a fenced worker learns it even between writes, and 2 when a
  failover lost the attempt's claim (the worker then writes again what it holds).
- `ABANDON` takes a job away from an attempt (dead, hung, or handing off at shutdown):
  fences it out and queues the job again, charging the death to it or not (the caller
  judges: see api/cluster/reaper.py), halving a suspect's group when it died among others,
  or ends it with `worker_lost` once the charged deaths reach MAX_ATTEMPTS or the requeues
  MAX_REQUEUES.
- `FAIL` lets an attempt end its own job with a small `Failed` entry (`storage_full`) when
  Redis refused its entries for memory: its first write is a delete, and Redis refuses only a
  script's first write that may grow memory, so a full Redis still takes it (BEAT refreshes
  its key behind a PEXPIRE for the same reason).
- `END` lets anyone else (the API) end a job with a terminal entry, fencing out the running
  attempt, if any.
- `END_IF_LATE` ends a queued job that no worker (re)started by its deadline: `queue_timeout`,
  or `worker_lost` if an attempt ran before (the relay calls it for a job it watches).
- `INDEXES` only reads: the ids in shards' `running` indexes, and those in their `pending`
  indexes since before a time; every shard's in one call on one server (the reaper's look
  around is one round trip, not one command per shard), one call per shard on a cluster.

The scripts use only commands Redis 7.0 has. Every script of the streams server touches the
keys of one shard only (a job's keys and its shard's `running` and `pending` indexes share a
hash tag: contract/keys.py), or, INDEXES, of one shard a call on a cluster, so that server
may be a Redis Cluster; the queues server's scripts (queues.py's and accounting.py's) need
one server, as RQ does. Besides those above, queues.py holds `FALL_BACK` (a routed job its
worker did not take goes back to the shared queue), `ROUTE_FOR_OWNER` (a key's bound on its
jobs waiting routed), `DEAD_BATCH` (how many jobs, or suspects, a dead worker
held), `DELETE_IF` (compare and delete) and `TAKE_OR_EXTEND` (the lock that lets one API
process drive the reaper or the batches); accounting.py the charges for what a key keeps
(its docstring lists them).
"""
