"""Lua scripts: the only way anything is written to a job's stream or its attempt state.

Each script runs atomically in Redis, so "is this attempt still the current one, has the job
ended, should it stop" is checked in the same step as the write:

- `ADMIT` counts a new job against its key's owner (queues server): refused when the owner
  already has the most unfinished jobs allowed or is over its request rate or byte budget,
  or when its Idempotency-Key names another job (then that job's id is returned). Checking a
  limit and counting the job against it are one step, so concurrent requests on any
  replicas cannot overshoot it. An ended job leaves its owner's count when a later ADMIT
  finds the owner at the limit (api/jobs/owners.py): the scripts that end a job run on the
  streams server and cannot reach the queues server's count.
- `RECORD` records an admitted job (streams server). The job is pending until its enqueuer
  says it is on an RQ queue.
- `RESERVE` holds a place in a model's queues for a new request, unless they are full.
- `TAKE` moves one job id from a model's queues (in priority order) into the taking
  worker's inbox, so that a worker that dies before claiming it loses nothing.
- `CLAIM` starts an attempt: bumps the epoch (fencing out every earlier attempt), counts the
  attempt, marks the job running and alive, unless the job has ended; a new job that waited
  past its start deadline is ended instead (`END_IF_LATE`'s rule; a requeued one a worker
  takes is not late: api/cluster/resumes.py). A retried claim (the same
  token, its reply lost) returns the same attempt. Returns the epoch and whether a cancel is
  due.
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
  judges: see api/cluster/reaper.py), or ends it with `worker_lost` once the charged deaths reach
  MAX_ATTEMPTS or the requeues MAX_REQUEUES.
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
may be a Redis Cluster; the queues server's scripts (ADMIT, RESERVE, TAKE, and
contract/holdings.py's for files and batches) need one server, as RQ does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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


# Every per-job script takes KEYS = job_keys(completion id).
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
-- An ended job keeps, for its retention, only what resume and fetch need: not its request
-- (unless its surface must show it later).
local function retain(retention)
  if redis.call('HGET', KEYS[1], '{JobField.KEEP_SPEC}') ~= '1' then
    redis.call('HDEL', KEYS[1], '{JobField.SPEC}', '{JobField.DIGEST}')
  end
  redis.call('EXPIRE', KEYS[1], retention)
  redis.call('EXPIRE', KEYS[2], retention)
end
-- Write a terminal entry (fields without the epoch) and close the job.
local function close(id, status, retention, fields, first)
  local epoch = redis.call('HINCRBY', KEYS[1], '{JobField.EPOCH}', 1)
  local args = {{'XADD', KEYS[2], '*', '{EPOCH}', tostring(epoch)}}
  for i = first, #fields do args[#args + 1] = fields[i] end
  redis.call(unpack(args))
  redis.call('HSET', KEYS[1], '{JobField.ENDED}', '1', '{JobField.STATUS}', status)
  retain(retention)
  redis.call('ZREM', KEYS[3], id)
  redis.call('DEL', KEYS[4])
  redis.call('ZREM', KEYS[5], id)
end
local QUEUE_TIMEOUT = {_lua_fields(errors.QUEUE_TIMEOUT.entry())}
local WORKER_LOST = {_lua_fields(errors.WORKER_LOST.entry())}
-- A queued job past its start deadline ends: queue_timeout, or worker_lost if an attempt ran.
local function end_if_late(id, retention)
  if redis.call('HGET', KEYS[1], '{JobField.STATUS}') ~= '{JobStatus.QUEUED}' then return 0 end
  local start_by = redis.call('HGET', KEYS[1], '{JobField.START_BY}')
  if not start_by or now_ms() <= tonumber(start_by) then return 0 end
  local late = QUEUE_TIMEOUT
  if tonumber(redis.call('HGET', KEYS[1], '{JobField.ATTEMPTS}') or '0') > 0 then late = WORKER_LOST end
  close(id, '{JobStatus.FAILED}', retention, late, 1)
  return 1
end
"""


def _spend(requests: str, bytes_: str, max_requests: str, max_bytes: str, size: str) -> str:
    """Lua that counts one request of `size` bytes against its owner's per-minute counters
    (`requests`, `bytes_`: keys; the maxima 0 for no limit), or returns {'rate', what} from
    the script when that would go over: check and count in the one step."""
    return f"""
if tonumber({max_requests}) > 0
   and tonumber(redis.call('GET', {requests}) or '0') >= tonumber({max_requests}) then
  return {{'rate', 'requests'}}
end
if tonumber({max_bytes}) > 0
   and tonumber(redis.call('GET', {bytes_}) or '0') + tonumber({size}) > tonumber({max_bytes}) then
  return {{'rate', 'bytes'}}
end
if tonumber({max_requests}) > 0 then
  redis.call('INCR', {requests})
  redis.call('EXPIRE', {requests}, 120)
end
if tonumber({max_bytes}) > 0 then
  redis.call('INCRBY', {bytes_}, {size})
  redis.call('EXPIRE', {bytes_}, 120)
end"""


ADMIT = f"""
-- KEYS[1]=the owner's unfinished jobs, KEYS[2]=the idempotency key, KEYS[3]=the owner's
-- requests this minute, KEYS[4]=their bytes (each KEYS[1] again where it does not apply)
-- ARGV[1]=completion id, ARGV[2]="<completion id> <request digest>" ('' without a key),
-- ARGV[3]=ttl seconds of an unfinished job, ARGV[4]=max unfinished jobs of the owner,
-- ARGV[5]=max requests per minute, ARGV[6]=max bytes per minute (each 0: no limit),
-- ARGV[7]=this request's bytes, ARGV[8]='1' if the job counts among the owner's unfinished.
-- Returns {{'new'}}, {{'held', "<id> <digest>"}} (the key names a job: the caller decides),
-- {{'limit', unfinished}} or {{'rate', 'requests' or 'bytes'}}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[2] ~= '' then
  local held = redis.call('GET', KEYS[2])
  if held then return {{'held', held}} end
end
if tonumber(ARGV[4]) > 0 and ARGV[8] == '1' then
  -- a job older than its ttl has expired, ended or not: it no longer counts
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[3]) * 1000)
  local unfinished = redis.call('ZCARD', KEYS[1])
  if unfinished >= tonumber(ARGV[4]) then return {{'limit', unfinished}} end
end
{_spend("KEYS[3]", "KEYS[4]", "ARGV[5]", "ARGV[6]", "ARGV[7]")}
if ARGV[8] == '1' then
  redis.call('ZADD', KEYS[1], now, ARGV[1])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
end
if ARGV[2] ~= '' then redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3]) end
return {{'new'}}
"""

RECORD = """
-- KEYS[1]=job hash, KEYS[2]=its shard's pending index
-- ARGV[1]=completion id, ARGV[2]=ttl seconds of an unfinished job, ARGV[3..]=the job
-- hash's fields and values. Returns 1 (0 if the job exists already: nothing is changed).
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local t = redis.call('TIME')
local fields = {'HSET', KEYS[1]}
for i = 3, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call(unpack(fields))
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), ARGV[1])
return 1
"""

RESERVE = """
-- KEYS[1..n-2]=a model's queue lists, KEYS[n-1]=its routed jobs' index (each waits in a
-- worker's routed queue), KEYS[n]=its reservations (request id -> ms)
-- ARGV[1]=max jobs waiting (0: no limit), ARGV[2]=the request's id, ARGV[3]=ms a
-- reservation lasts (its enqueue takes far less; an API that died leaves it to expire)
-- Returns {1, depth} with a place reserved, or {0, depth} when the queues are full: the
-- check and the reservation are one step, so concurrent requests cannot overshoot.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = KEYS[#KEYS]
redis.call('ZREMRANGEBYSCORE', held, '-inf', now - tonumber(ARGV[3]))
local depth = redis.call('ZCARD', held) + redis.call('ZCARD', KEYS[#KEYS - 1])
for i = 1, #KEYS - 2 do depth = depth + redis.call('LLEN', KEYS[i]) end
if tonumber(ARGV[1]) > 0 and depth >= tonumber(ARGV[1]) then return {0, depth} end
redis.call('ZADD', held, now, ARGV[2])
redis.call('PEXPIRE', held, ARGV[3])
return {1, depth}
"""

TAKE = """
-- KEYS[1..n-1]=a model's queue lists in the order to take from, KEYS[n]=the worker's inbox
-- Returns {queue key, RQ job id} or false when every queue is empty.
local inbox = KEYS[#KEYS]
local t = redis.call('TIME')
for i = 1, #KEYS - 1 do
  local id = redis.call('LPOP', KEYS[i])
  if id then
    redis.call('HSET', inbox, id, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
    return {KEYS[i], id}
  end
end
return false
"""

CLAIM = (
    _LIB
    + f"""
-- ARGV[1]=worker name, ARGV[2]=completion id, ARGV[3]=heartbeat window ms,
-- ARGV[4]=retention seconds (for a job that it ends as late), ARGV[5]=claim token,
-- ARGV[6]=digest of the spec the worker is about to run
-- Returns {{epoch, cancel, suspect}}: epoch -1 = the job is gone (expired or purged), 0 = it
-- has ended, or had waited too long in the queue (then this call ended it), -2 = the spec is
-- not the one the API recorded (a planted job: nothing is changed), -3 = a live attempt runs
-- it (a queue entry a failover put back: nothing is changed).
local function claimed()
  local suspect = 0
  if redis.call('HGET', KEYS[1], '{JobField.SUSPECT}') == '1' then suspect = 1 end
  return {{tonumber(redis.call('HGET', KEYS[1], '{JobField.EPOCH}')), cancel_due(KEYS[1]), suspect}}
end
if redis.call('EXISTS', KEYS[1]) == 0 then return {{-1, 0, 0}} end
if redis.call('HGET', KEYS[1], '{JobField.ENDED}') == '1' then return {{0, 0, 0}} end
if redis.call('HGET', KEYS[1], '{JobField.DIGEST}') ~= ARGV[6] then return {{-2, 0, 0}} end
if redis.call('HGET', KEYS[1], '{JobField.CLAIM}') == ARGV[5] then return claimed() end
-- running, and its attempt alive: this is a second copy of its queue entry (a failover
-- rolled back the pop that took it), not a job given back
if redis.call('HGET', KEYS[1], '{JobField.STATUS}') == '{JobStatus.RUNNING}'
   and redis.call('EXISTS', KEYS[4]) == 1 then
  return {{-3, 0, 0}}
end
-- a new job past its deadline ends; a requeued one a worker takes now is not late
if tonumber(redis.call('HGET', KEYS[1], '{JobField.ATTEMPTS}') or '0') == 0
   and end_if_late(ARGV[2], ARGV[4]) == 1 then
  return {{0, 0, 0}}
end
local epoch = redis.call('HINCRBY', KEYS[1], '{JobField.EPOCH}', 1)
redis.call('HINCRBY', KEYS[1], '{JobField.ATTEMPTS}', 1)
redis.call('HSET', KEYS[1], '{JobField.STATUS}', '{JobStatus.RUNNING}', '{JobField.WORKER}', ARGV[1],
           '{JobField.CLAIM}', ARGV[5], '{JobField.SEQ}', 0)
redis.call('ZADD', KEYS[3], now_ms(), ARGV[2])
redis.call('SET', KEYS[4], epoch, 'PX', ARGV[3])
redis.call('ZREM', KEYS[5], ARGV[2])
return claimed()
"""
)

APPEND = (
    _LIB
    + f"""
-- ARGV[1]=epoch, ARGV[2]=final status ('' unless the last entry is terminal),
-- ARGV[3]=retention seconds, ARGV[4]=completion id, ARGV[5]=the attempt's number of its
-- first entry here (0 for its first), ARGV[6]=number of entries, ARGV[7]=the attempt's claim
-- token, ARGV[8]=its worker, ARGV[9]=heartbeat window ms, then per entry: its stream id (the
-- one it had for an entry written again; for a new one, the id the worker chose, after every
-- id it knows, or, should that be taken, a new one), its number of field/value strings, then
-- those strings.
-- Returns {{cancel flag, the stream id of each entry of this call}}, or the error
-- 'BEHIND <n>' when the job holds only the attempt's first n entries: a failover lost the
-- others, and the attempt writes them again, with their ids, from its record.
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('FENCED job gone') end
local held = tonumber(redis.call('HGET', KEYS[1], '{JobField.EPOCH}') or '0')
local mine = tonumber(ARGV[1])
if held > mine then return redis.error_reply('FENCED stale attempt') end
if held == mine and redis.call('HGET', KEYS[1], '{JobField.CLAIM}') ~= ARGV[7] then
  return redis.error_reply('FENCED claimed again after a failover')
end
if held < mine then
  -- epochs only grow: a failover lost this attempt's claim (and so all it wrote). Claim
  -- again, as CLAIM did.
  if redis.call('HGET', KEYS[1], '{JobField.ENDED}') == '1' then
    return redis.error_reply('FENCED job ended')
  end
  redis.call('HSET', KEYS[1], '{JobField.EPOCH}', mine, '{JobField.STATUS}', '{JobStatus.RUNNING}',
             '{JobField.WORKER}', ARGV[8], '{JobField.CLAIM}', ARGV[7], '{JobField.SEQ}', 0)
  redis.call('HINCRBY', KEYS[1], '{JobField.ATTEMPTS}', 1)
  redis.call('ZADD', KEYS[3], now_ms(), ARGV[4])
  redis.call('SET', KEYS[4], mine, 'PX', ARGV[9])
  redis.call('ZREM', KEYS[5], ARGV[4])
end
local count = tonumber(ARGV[6])
local seq = tonumber(redis.call('HGET', KEYS[1], '{JobField.SEQ}') or '0')
local skip = seq - tonumber(ARGV[5])
if skip < 0 then return redis.error_reply('BEHIND ' .. seq) end
local out = {{0}}
if skip > 0 and count > 0 then
  -- a retry (its reply lost): the ids of the entries already written, for the record
  local back = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', skip)
  for n = #back, 1, -1 do
    if #out <= count then out[#out + 1] = back[n][1] end
  end
end
if skip >= count then
  out[1] = cancel_due(KEYS[1])
  return out
end
if redis.call('HGET', KEYS[1], '{JobField.ENDED}') == '1' then
  return redis.error_reply('FENCED job ended')
end
local created = redis.call('EXISTS', KEYS[2]) == 0
local i = 10
for n = 1, count do
  local size = tonumber(ARGV[i + 1])
  if n > skip then
    local args = {{'XADD', KEYS[2], ARGV[i]}}
    for j = i + 2, i + 1 + size do args[#args + 1] = ARGV[j] end
    local added = redis.pcall(unpack(args))
    if type(added) == 'table' and added.err then  -- the id is taken: the stream is past it
      args[3] = '*'
      added = redis.call(unpack(args))
    end
    out[#out + 1] = added
  end
  i = i + size + 2
end
redis.call('HINCRBY', KEYS[1], '{JobField.SEQ}', count - skip)
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], '{JobField.ENDED}', '1', '{JobField.STATUS}', ARGV[2])
  retain(ARGV[3])
  redis.call('ZREM', KEYS[3], ARGV[4])
  redis.call('DEL', KEYS[4])
elseif created then
  -- the stream was just created: it lives as long as the job hash
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
end
out[1] = cancel_due(KEYS[1])
return out
"""
)

BEAT = f"""
-- KEYS[1]=job hash, KEYS[2]=alive key; ARGV[1]=epoch, ARGV[2]=window ms, ARGV[3]=claim token.
-- Returns 1 while the attempt is current (and refreshes its liveness), 2 when a failover
-- lost its claim (its epoch is above the job's: its next APPEND claims again), else 0.
local held = tonumber(redis.call('HGET', KEYS[1], '{JobField.EPOCH}') or '0')
if redis.call('HGET', KEYS[1], '{JobField.ENDED}') == '1' then return 0 end
if held < tonumber(ARGV[1]) and redis.call('EXISTS', KEYS[1]) == 1 then return 2 end
if held ~= tonumber(ARGV[1]) or redis.call('HGET', KEYS[1], '{JobField.CLAIM}') ~= ARGV[3] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return 1
"""

CLEAR_SUSPECT = f"""
-- KEYS[1]=job hash; ARGV[1]=epoch, ARGV[2]=claim token. A suspect that went on past where
-- it died is nobody's suspect any more: a death is no longer charged to it, and those
-- charged before no longer count, since MAX_ATTEMPTS counts deaths where the job stands
-- (api/cluster/reaper.py). Returns 1, or 0 when the attempt is no longer the job's current one.
if tonumber(redis.call('HGET', KEYS[1], '{JobField.EPOCH}') or '0') ~= tonumber(ARGV[1])
  or redis.call('HGET', KEYS[1], '{JobField.CLAIM}') ~= ARGV[2] then
  return 0
end
redis.call('HDEL', KEYS[1], '{JobField.SUSPECT}', '{JobField.CHARGED}')
return 1
"""

ABANDON = (
    _LIB
    + f"""
-- ARGV[1]=the epoch being abandoned, ARGV[2]=completion id, ARGV[3]=1 to charge the death
-- to the job, ARGV[4]=1 to mark it a suspect, ARGV[5]=charged deaths that end it
-- (MAX_ATTEMPTS), ARGV[6]=requeues that end it (MAX_REQUEUES), ARGV[7]=ms a new attempt has
-- to start (or until the job's WAIT_UNTIL, if later), ARGV[8]=retention seconds, ARGV[9]=1 if
-- this requeue counts toward MAX_REQUEUES (a preemption does not: nothing went wrong).
-- Returns {{1, suspect}} = requeued (the caller enqueues the continuation on the suspect
-- queue if suspect is 1), {{2, 0}} = ended with worker_lost, {{0, 0}} = nothing to do (the job
-- ended, or that attempt is no longer current).
if redis.call('HGET', KEYS[1], '{JobField.EPOCH}') ~= ARGV[1]
   or redis.call('HGET', KEYS[1], '{JobField.ENDED}') == '1' then
  redis.call('ZREM', KEYS[3], ARGV[2])
  return {{0, 0}}
end
local requeues = tonumber(redis.call('HGET', KEYS[1], '{JobField.REQUEUES}') or '0')
if ARGV[9] == '1' then requeues = redis.call('HINCRBY', KEYS[1], '{JobField.REQUEUES}', 1) end
local charged = tonumber(redis.call('HGET', KEYS[1], '{JobField.CHARGED}') or '0')
if ARGV[3] == '1' then charged = redis.call('HINCRBY', KEYS[1], '{JobField.CHARGED}', 1) end
if charged >= tonumber(ARGV[5]) or requeues > tonumber(ARGV[6]) then
  close(ARGV[2], '{JobStatus.FAILED}', ARGV[8], WORKER_LOST, 1)
  return {{2, 0}}
end
if ARGV[4] == '1' then redis.call('HSET', KEYS[1], '{JobField.SUSPECT}', '1') end
redis.call('HINCRBY', KEYS[1], '{JobField.EPOCH}', 1)
local start_by = now_ms() + tonumber(ARGV[7])
local wait_until = tonumber(redis.call('HGET', KEYS[1], '{JobField.WAIT_UNTIL}') or '0')
if wait_until > start_by then start_by = wait_until end
redis.call('HSET', KEYS[1], '{JobField.STATUS}', '{JobStatus.QUEUED}', '{JobField.START_BY}', start_by)
redis.call('HDEL', KEYS[1], '{JobField.WORKER}', '{JobField.CLAIM}')
redis.call('ZREM', KEYS[3], ARGV[2])
redis.call('DEL', KEYS[4])
redis.call('ZADD', KEYS[5], now_ms(), ARGV[2])
local suspect = 0
if redis.call('HGET', KEYS[1], '{JobField.SUSPECT}') == '1' then suspect = 1 end
return {{1, suspect}}
"""
)

END = (
    _LIB
    + f"""
-- ARGV[1]=final status, ARGV[2]=retention seconds, ARGV[3]=only if the job's status is
-- this ('' = any), ARGV[4]=completion id, ARGV[5..]=entry fields without epoch.
-- Returns 1 if this call ended the job, 0 if it was gone, had ended, or had another status.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HGET', KEYS[1], '{JobField.ENDED}') == '1' then return 0 end
if ARGV[3] ~= '' and redis.call('HGET', KEYS[1], '{JobField.STATUS}') ~= ARGV[3] then return 0 end
close(ARGV[4], ARGV[1], ARGV[2], ARGV, 5)
return 1
"""
)

END_IF_LATE = (
    _LIB
    + """
-- ARGV[1]=completion id, ARGV[2]=retention seconds.
-- Returns 1 if this call ended the job (queued past its deadline), else 0.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
return end_if_late(ARGV[1], ARGV[2])
"""
)

INDEXES = """
-- KEYS: shards' running and pending indexes, in pairs (`index_keys`). ARGV[1]=the newest
-- pending score wanted ('' for no pending ids), ARGV[2]=the most pending ids per shard.
-- Returns {running ids, pending ids}, the shards' one after the other.
local running, pending = {}, {}
for i = 1, #KEYS, 2 do
  for _, id in ipairs(redis.call('ZRANGE', KEYS[i], 0, -1)) do running[#running + 1] = id end
  if ARGV[1] ~= '' then
    local old = redis.call('ZRANGEBYSCORE', KEYS[i + 1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
    for _, id in ipairs(old) do pending[#pending + 1] = id end
  end
end
return {running, pending}
"""

FENCED = "FENCED"
BEHIND = "BEHIND"


@dataclass(frozen=True)
class Claim:
    """What APPEND and BEAT check an attempt's writes against, and what APPEND restores when
    a failover lost the claim: its epoch, its token, its worker and its heartbeat window."""

    epoch: int
    token: str
    worker: str
    window_ms: int


def final_status(entry: Entry) -> str:
    """The job status a terminal entry sets ('' for a non-terminal one)."""
    if isinstance(entry, Finished):
        return JobStatus.CANCELLED if entry.finish_reason == CANCELLED else JobStatus.DONE
    if isinstance(entry, Failed):
        return JobStatus.FAILED
    return ""


def append_args(
    completion_id: str,
    claim: Claim,
    first_seq: int,
    batch: Sequence[tuple[str, Entry]],
    retention_s: int,
) -> list[str]:
    """ARGV for APPEND: one attempt's entries, in order, the first being the attempt's
    `first_seq`-th, each with its stream id (for a new one, the id the worker chose:
    `Attempt.next_ids`). Only the last may be terminal; every entry carries the claim's
    epoch. An empty batch only claims again."""
    if claim.epoch < 1 or any(e.epoch != claim.epoch for _, e in batch):
        raise ValueError("APPEND takes entries of one (stamped) attempt")
    if any(final_status(e) for _, e in batch[:-1]):
        raise ValueError("a terminal entry must be the last one")
    out = [
        str(claim.epoch),
        final_status(batch[-1][1]) if batch else "",
        str(retention_s),
        completion_id,
        str(first_seq),
        str(len(batch)),
        claim.token,
        claim.worker,
        str(claim.window_ms),
    ]
    for entry_id, entry in batch:
        fields = _flat(encode(entry))
        out += [entry_id, str(len(fields)), *fields]
    return out


def end_args(
    completion_id: str, entry: Failed | Finished, retention_s: int, only_if_status: str = ""
) -> list[str]:
    """ARGV for END (the script stamps the epoch itself; the entry's epoch is ignored)."""
    return [final_status(entry), str(retention_s), only_if_status, completion_id, *_without_epoch(entry)]


def abandon_args(
    completion_id: str,
    epoch: int,
    *,
    charge: bool,
    suspect: bool,
    max_charged: int,
    max_requeues: int,
    resume_wait_ms: int,
    retention_s: int,
    counted: bool = True,
) -> list[str]:
    return [
        str(epoch),
        completion_id,
        "1" if charge else "0",
        "1" if suspect else "0",
        str(max_charged),
        str(max_requeues),
        str(resume_wait_ms),
        str(retention_s),
        "1" if counted else "0",
    ]


def claim_args(
    worker: str, completion_id: str, window_ms: int, retention_s: int, token: str, digest: str
) -> list[str]:
    return [worker, completion_id, str(window_ms), str(retention_s), token, digest]


def end_if_late_args(completion_id: str, retention_s: int) -> list[str]:
    return [completion_id, str(retention_s)]


def job_keys(completion_id: str) -> list[str]:
    """KEYS for every per-job script but BEAT: job hash, events, its shard's running index,
    alive key, its shard's pending index (one hash tag: one cluster slot)."""
    shard = keys.shard(completion_id)
    return [
        keys.job(completion_id),
        keys.events(completion_id),
        keys.running(shard),
        keys.alive(completion_id),
        keys.pending(shard),
    ]


def index_keys(cluster: bool) -> list[list[str]]:
    """KEYS for each INDEXES call: every shard's running and pending index in one call on one
    server; on a cluster, where a script may touch one slot only, one call per shard."""
    pairs = [[keys.running(shard), keys.pending(shard)] for shard in range(keys.SHARDS)]
    return pairs if cluster else [[key for pair in pairs for key in pair]]


def take_keys(queue_names: Sequence[str], worker: str) -> list[str]:
    """KEYS for TAKE: the lists of the queues named, in order, then the worker's inbox."""
    return [*(keys.rq_queue_key(name) for name in queue_names), keys.inbox(worker)]
