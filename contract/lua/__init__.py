"""Every Lua script tokenspool runs, by the server and the part that runs it. The job-stream scripts
(library.py, attempts.py, jobs.py) are apart from the queues' (queues.py) and the accounting
(accounting.py). Each is the only way its keys are written.

Each script runs atomically in Redis. So a script checks its conditions in the same step as its
write. Is this attempt still the current one? Has the job ended? Should it stop?

- `ADMIT` counts a new job against its key's owner (queues server). It refuses the job when the
  owner already has the most unfinished jobs allowed. It also refuses when the owner is over its
  request rate, byte or token budget. It refuses, too, when the Idempotency-Key names another job,
  and then returns that job's id. Checking a limit and counting the job against it are one step. So
  concurrent requests on any replicas cannot overshoot it. An ended job leaves its owner's count
  when a later ADMIT finds the owner at the limit (api/jobs/owners.py). The scripts that end a job
  run on the streams server, and cannot reach the queues server's count.
- `SETTLE` turns an ended job's reserved tokens into the tokens it used, once (queues server). The
  API that reads its end runs it, or the owner's next ADMIT that finds it short.
- `RECORD` records an admitted job (streams server). The job is pending until its enqueuer says it
  is on an RQ queue.
- `RESERVE` holds a place in a model's queues for a new request, unless they are full.
- `TAKE` moves one job id from a model's queues, in priority order, into the taking worker's inbox.
  So a worker that dies before claiming it loses nothing. Of the suspects, it takes the first whose
  group allows one more beside the worker's own.
- `CLAIM` starts an attempt, unless the job has ended. It bumps the epoch, which fences out every
  earlier attempt. It counts the attempt and marks the job running and alive. A new job that waited
  past its start deadline is ended instead (`END_IF_LATE`'s rule). A requeued one a worker takes is
  not late (api/cluster/resumes.py). A retried claim (the same token, its reply lost) returns the
  same attempt. It returns the epoch, whether a cancel is due, and whether the job is a suspect,
  with its group.
- `APPEND` writes one or more entries of an attempt. A worker batches what piled up while its
  previous write was in flight. It is refused with a `FENCED` error unless the epoch is current and
  the job has not ended. A terminal entry marks the job ended and starts its retention. Each attempt
  numbers its entries, and a retried APPEND (its reply lost) skips those already written. So nothing
  is published twice. It returns each entry's stream id and the cancel flag. So a worker learns of a
  cancel on the write it makes anyway. A failover may lose the attempt's last writes
  (docs/protocol.md, "Failover"). Then it answers `BEHIND n`, and the worker writes the lost entries
  again with the ids they had. An attempt whose claim was lost claims again. Its epoch is above the
  job's, since epochs only grow.
- `BEAT` is the attempt's heartbeat. It refreshes its liveness key while the epoch is current. It
  returns 0 once the epoch is not current, so a fenced worker learns it even between writes. It
  returns 2 when a failover lost the attempt's claim. The worker then writes again what it holds.
- `ABANDON` takes a job away from an attempt (dead, hung, or handing off at shutdown). It fences the
  attempt out and queues the job again. It charges the death to the attempt or not, as the caller
  judges (see api/cluster/reaper.py). It halves a suspect's group when it died among others. It ends
  the job with `worker_lost` once the charged deaths reach MAX_ATTEMPTS or the requeues MAX_REQUEUES.
- `FAIL` lets an attempt end its own job with a small `Failed` entry (`storage_full`). It does so
  when Redis refused its entries for memory. Its first write is a delete. Redis refuses only a
  script's first write that may grow memory, so a full Redis still takes it. (BEAT refreshes its key
  behind a PEXPIRE for the same reason.)
- `END` lets anyone else (the API) end a job with a terminal entry. It fences out the running
  attempt, if any.
- `END_IF_LATE` ends a queued job that no worker (re)started by its deadline. It ends it with
  `queue_timeout`, or `worker_lost` if an attempt ran before. The relay calls it for a job it
  watches.
- `INDEXES` only reads. It returns the ids in shards' `running` indexes, and those in their
  `pending` indexes since before a time. On one server it reads every shard's in one call. So the
  reaper's look around is one round trip, not one command per shard. On a cluster it takes one call
  per shard.

The scripts use only commands Redis 7.0 has. Every script of the streams server touches the keys of
one shard only. A job's keys and its shard's `running` and `pending` indexes share a hash tag
(contract/keys.py). On a cluster, INDEXES touches one shard a call. So that server may be a Redis
Cluster. The queues server's scripts (queues.py's and accounting.py's) need one server, as RQ does.

Besides those above, queues.py holds `FALL_BACK`, `ROUTE_FOR_OWNER`, `DEAD_BATCH`, `DELETE_IF` and
`TAKE_OR_EXTEND`. `FALL_BACK` sends a routed job its worker did not take back to the shared queue.
`ROUTE_FOR_OWNER` is a key's bound on its jobs waiting routed. `DEAD_BATCH` counts how many jobs, or
suspects, a dead worker held. `DELETE_IF` is compare and delete. `TAKE_OR_EXTEND` is the lock that
lets one API process drive the reaper or the batches. The charges for what a key keeps are in
accounting.py (its docstring lists them).
"""
