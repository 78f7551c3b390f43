"""Lua scripts: the only way anything is written to a job's stream or its attempt state.

Each script runs atomically in Redis, so "is this attempt still the current one, has the job
ended, should it stop" is checked in the same step as the write:

- `CLAIM` starts an attempt: bumps the epoch (fencing out every earlier attempt), counts the
  attempt, marks the job running and alive, unless the job has ended; a job that waited past
  its start deadline is ended instead (`END_IF_LATE`'s rule). Returns the new epoch and
  whether a cancel is due.
- `APPEND` writes one or more entries of an attempt (a worker batches what piled up while
  its previous write was in flight): refused with a `FENCED` error unless the epoch is
  current and the job has not ended; a terminal entry marks the job ended and starts its
  retention. Returns the entry id and the cancel flag, so a worker learns of a cancel on
  the write it makes anyway.
- `BEAT` is the attempt's heartbeat: refreshes its liveness key while the epoch is current;
  returns 0 once it is not, so a fenced worker learns it even between writes.
- `ABANDON` takes a job away from an attempt (dead, hung, or handing off at shutdown):
  fences it out and puts the job back to queued for a new attempt, or ends it with
  `worker_lost` once the attempts are used up.
- `END` lets anyone else (the API) end a job with a terminal entry, fencing out the running
  attempt, if any.
- `END_IF_LATE` ends a queued job that no worker (re)started by its deadline: `queue_timeout`,
  or `worker_lost` if an attempt ran before (the relay calls it for a job it watches).

The scripts use only commands Redis 7.0 has. Per-job keys share the completion id's hash
tag; `RUNNING` is one global index (RQ does not run on Redis Cluster either).
"""

from __future__ import annotations

from collections.abc import Sequence

from contract import errors, keys
from contract.entries import CANCELLED, EPOCH, Entry, Failed, Finished, encode
from contract.keys import JobField, JobStatus


def _lua_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _lua_fields(entry: Failed) -> str:
    """A terminal entry's fields (without the epoch) as a Lua table literal."""
    return "{" + ", ".join(_lua_string(x) for x in _without_epoch(entry)) + "}"


def _flat(fields: dict[str, str]) -> list[str]:
    return [x for pair in fields.items() for x in pair]


def _without_epoch(entry: Entry) -> list[str]:
    fields = encode(entry)
    del fields[EPOCH]
    return _flat(fields)


_LIB = f"""
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function cancel_due(job)
  local at = redis.call('HGET', job, '{JobField.CANCEL_AT}')
  if not at then return 0 end
  if now_ms() >= tonumber(at) then return 1 end
  return 0
end
-- Write a terminal entry (fields without the epoch) and close the job.
local function close(job, events, running, alive, id, status, retention, fields, first)
  local epoch = redis.call('HINCRBY', job, '{JobField.EPOCH}', 1)
  local args = {{'XADD', events, '*', '{EPOCH}', tostring(epoch)}}
  for i = first, #fields do args[#args + 1] = fields[i] end
  redis.call(unpack(args))
  redis.call('HSET', job, '{JobField.ENDED}', '1', '{JobField.STATUS}', status)
  redis.call('EXPIRE', job, retention)
  redis.call('EXPIRE', events, retention)
  redis.call('ZREM', running, id)
  redis.call('DEL', alive)
end
local QUEUE_TIMEOUT = {_lua_fields(errors.QUEUE_TIMEOUT.entry())}
local WORKER_LOST = {_lua_fields(errors.WORKER_LOST.entry())}
-- A queued job past its start deadline ends: queue_timeout, or worker_lost if an attempt ran.
local function end_if_late(job, events, running, alive, id, retention)
  if redis.call('HGET', job, '{JobField.STATUS}') ~= '{JobStatus.QUEUED}' then return 0 end
  local start_by = redis.call('HGET', job, '{JobField.START_BY}')
  if not start_by or now_ms() <= tonumber(start_by) then return 0 end
  local late = QUEUE_TIMEOUT
  if tonumber(redis.call('HGET', job, '{JobField.ATTEMPTS}') or '0') > 0 then late = WORKER_LOST end
  close(job, events, running, alive, id, '{JobStatus.FAILED}', retention, late, 1)
  return 1
end
"""

CLAIM = (
    _LIB
    + f"""
-- KEYS[1]=job hash, KEYS[2]=events stream, KEYS[3]=running index, KEYS[4]=alive key
-- ARGV[1]=worker name, ARGV[2]=completion id, ARGV[3]=heartbeat window ms,
-- ARGV[4]=retention seconds (for a job that it ends as late)
-- Returns {{epoch, cancel}}: epoch -1 = the job is gone (expired or purged), 0 = it has
-- ended, or had waited too long in the queue (then this call ended it).
if redis.call('EXISTS', KEYS[1]) == 0 then return {{-1, 0}} end
if redis.call('HGET', KEYS[1], '{JobField.ENDED}') == '1' then return {{0, 0}} end
if end_if_late(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2], ARGV[4]) == 1 then return {{0, 0}} end
local epoch = redis.call('HINCRBY', KEYS[1], '{JobField.EPOCH}', 1)
redis.call('HINCRBY', KEYS[1], '{JobField.ATTEMPTS}', 1)
redis.call('HSET', KEYS[1], '{JobField.STATUS}', '{JobStatus.RUNNING}', '{JobField.WORKER}', ARGV[1])
redis.call('ZADD', KEYS[3], now_ms(), ARGV[2])
redis.call('SET', KEYS[4], epoch, 'PX', ARGV[3])
return {{epoch, cancel_due(KEYS[1])}}
"""
)

APPEND = (
    _LIB
    + f"""
-- KEYS[1]=job hash, KEYS[2]=events stream, KEYS[3]=running index, KEYS[4]=alive key
-- ARGV[1]=epoch, ARGV[2]=final status ('' unless the last entry is terminal),
-- ARGV[3]=retention seconds, ARGV[4]=completion id, ARGV[5]=number of entries, then per
-- entry: its number of field/value strings, then those strings.
-- Returns {{last entry id, cancel}}.
if redis.call('HGET', KEYS[1], '{JobField.EPOCH}') ~= ARGV[1] then
  return redis.error_reply('FENCED stale attempt')
end
if redis.call('HGET', KEYS[1], '{JobField.ENDED}') == '1' then
  return redis.error_reply('FENCED job ended')
end
local created = redis.call('EXISTS', KEYS[2]) == 0
local id
local i = 6
for _ = 1, tonumber(ARGV[5]) do
  local n = tonumber(ARGV[i])
  local args = {{'XADD', KEYS[2], '*'}}
  for j = i + 1, i + n do args[#args + 1] = ARGV[j] end
  id = redis.call(unpack(args))
  i = i + n + 1
end
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], '{JobField.ENDED}', '1', '{JobField.STATUS}', ARGV[2])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  redis.call('EXPIRE', KEYS[2], ARGV[3])
  redis.call('ZREM', KEYS[3], ARGV[4])
  redis.call('DEL', KEYS[4])
elseif created then
  -- the stream was just created: it lives as long as the job hash
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
end
return {{id, cancel_due(KEYS[1])}}
"""
)

BEAT = f"""
-- KEYS[1]=job hash, KEYS[2]=alive key; ARGV[1]=epoch, ARGV[2]=window ms.
-- Returns 1 while the attempt is current (and refreshes its liveness), else 0.
if redis.call('HGET', KEYS[1], '{JobField.EPOCH}') ~= ARGV[1]
   or redis.call('HGET', KEYS[1], '{JobField.ENDED}') == '1' then
  return 0
end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return 1
"""

ABANDON = (
    _LIB
    + f"""
-- KEYS[1]=job hash, KEYS[2]=events stream, KEYS[3]=running index, KEYS[4]=alive key
-- ARGV[1]=the epoch being abandoned, ARGV[2]=completion id, ARGV[3]=max attempts,
-- ARGV[4]=ms a new attempt has to start, ARGV[5]=retention seconds.
-- Returns 1 = requeue it (the caller enqueues the continuation), 2 = ended (worker_lost),
-- 0 = nothing to do (the job ended, or that attempt is no longer current).
if redis.call('HGET', KEYS[1], '{JobField.EPOCH}') ~= ARGV[1]
   or redis.call('HGET', KEYS[1], '{JobField.ENDED}') == '1' then
  redis.call('ZREM', KEYS[3], ARGV[2])
  return 0
end
local attempts = tonumber(redis.call('HGET', KEYS[1], '{JobField.ATTEMPTS}') or '0')
if attempts >= tonumber(ARGV[3]) then
  close(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2], '{JobStatus.FAILED}', ARGV[5], WORKER_LOST, 1)
  return 2
end
redis.call('HINCRBY', KEYS[1], '{JobField.EPOCH}', 1)
redis.call('HSET', KEYS[1], '{JobField.STATUS}', '{JobStatus.QUEUED}',
           '{JobField.START_BY}', now_ms() + tonumber(ARGV[4]))
redis.call('HDEL', KEYS[1], '{JobField.WORKER}')
redis.call('ZREM', KEYS[3], ARGV[2])
redis.call('DEL', KEYS[4])
return 1
"""
)

END = (
    _LIB
    + f"""
-- KEYS[1]=job hash, KEYS[2]=events stream, KEYS[3]=running index, KEYS[4]=alive key
-- ARGV[1]=final status, ARGV[2]=retention seconds, ARGV[3]=only if the job's status is
-- this ('' = any), ARGV[4]=completion id, ARGV[5..]=entry fields without epoch.
-- Returns 1 if this call ended the job, 0 if it was gone, had ended, or had another status.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HGET', KEYS[1], '{JobField.ENDED}') == '1' then return 0 end
if ARGV[3] ~= '' and redis.call('HGET', KEYS[1], '{JobField.STATUS}') ~= ARGV[3] then return 0 end
close(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[4], ARGV[1], ARGV[2], ARGV, 5)
return 1
"""
)

END_IF_LATE = (
    _LIB
    + """
-- KEYS[1]=job hash, KEYS[2]=events stream, KEYS[3]=running index, KEYS[4]=alive key
-- ARGV[1]=completion id, ARGV[2]=retention seconds.
-- Returns 1 if this call ended the job (queued past its deadline), else 0.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
return end_if_late(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2])
"""
)

FENCED = "FENCED"


def final_status(entry: Entry) -> str:
    """The job status a terminal entry sets ('' for a non-terminal one)."""
    if isinstance(entry, Finished):
        return JobStatus.CANCELLED if entry.finish_reason == CANCELLED else JobStatus.DONE
    if isinstance(entry, Failed):
        return JobStatus.FAILED
    return ""


def append_args(completion_id: str, batch: Sequence[Entry], retention_s: int) -> list[str]:
    """ARGV for APPEND: one attempt's entries, in order (the epoch comes from the entries;
    only the last may be terminal)."""
    if not batch or batch[0].epoch < 1 or any(e.epoch != batch[0].epoch for e in batch):
        raise ValueError("APPEND takes one or more entries of one (stamped) attempt")
    if any(final_status(e) for e in batch[:-1]):
        raise ValueError("a terminal entry must be the last one")
    out = [str(batch[0].epoch), final_status(batch[-1]), str(retention_s), completion_id, str(len(batch))]
    for entry in batch:
        fields = _flat(encode(entry))
        out += [str(len(fields)), *fields]
    return out


def end_args(
    completion_id: str, entry: Failed | Finished, retention_s: int, only_if_status: str = ""
) -> list[str]:
    """ARGV for END (the script stamps the epoch itself; the entry's epoch is ignored)."""
    return [final_status(entry), str(retention_s), only_if_status, completion_id, *_without_epoch(entry)]


def abandon_args(
    completion_id: str, epoch: int, max_attempts: int, resume_wait_ms: int, retention_s: int
) -> list[str]:
    return [str(epoch), completion_id, str(max_attempts), str(resume_wait_ms), str(retention_s)]


def claim_args(worker: str, completion_id: str, window_ms: int, retention_s: int) -> list[str]:
    return [worker, completion_id, str(window_ms), str(retention_s)]


def end_if_late_args(completion_id: str, retention_s: int) -> list[str]:
    return [completion_id, str(retention_s)]


def job_keys(completion_id: str) -> list[str]:
    """KEYS for every script but BEAT: job hash, events, running index, alive key."""
    return [keys.job(completion_id), keys.events(completion_id), keys.RUNNING, keys.alive(completion_id)]
