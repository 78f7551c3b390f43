"""The scripts that record, end, requeue and find jobs (streams server). They are RECORD, ABANDON,
END, END_IF_LATE and INDEXES, with the arguments each takes (package docstring).
"""

from __future__ import annotations

from contract import keys
from contract.entries import Failed, Finished
from contract.keys import JobField, JobStatus
from contract.lua.library import LIB, _without_epoch, final_status
from contract.settings import Recovery

RECORD = """
-- KEYS[1]=job hash, KEYS[2]=its shard's pending index
-- ARGV[1]=job id, ARGV[2]=ttl seconds of an unfinished job, ARGV[3..]=the job
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


ABANDON = (
    LIB
    + f"""
-- ARGV[1]=the epoch being abandoned, ARGV[2]=job id, ARGV[3]=1 to charge the death to the
-- job if it stood still (it ran alone, or was its worker's suspect), ARGV[4]=the deaths in a
-- row standing still that make it a suspect (0: not a death of its own to count: a hand-off,
-- a preemption, or a death its worker's suspect explains), ARGV[5]=charged deaths that end it
-- (MAX_ATTEMPTS), ARGV[6]=requeues standing still that end it (MAX_REQUEUES), ARGV[7]=ms a new
-- attempt has to start (or until the job's WAIT_UNTIL, if later), ARGV[8]=retention seconds,
-- ARGV[9]=1 if this requeue counts toward MAX_REQUEUES (a preemption does not: nothing went
-- wrong), ARGV[10]=entries the attempt must have written to have gone on (its Started entry,
-- then a Delta a token: 1 + SUSPECT_TOKENS), ARGV[11]=the suspects its worker held, which
-- stepped as one group (0: not a suspect's death).
-- A job that went on is nobody's culprit: its charges, stalls and suspicion go. One that
-- stood still counts the death (api/cluster/reaper.py says whose it is); a suspect that
-- stood still in a group of g halves the most it may step with (GROUP): ceil(g / 2).
-- Returns {{1, suspect, charged, group}} = requeued (the caller enqueues the continuation on
-- the suspect queue if suspect is 1, `group` being its GROUP, 0 for any; charged is 1 if
-- this death was charged to it), {{2, 0, 1, 0}} = ended with worker_lost, {{0, 0, 0, 0}} =
-- nothing to do (the job ended, or that attempt is no longer current).
if redis.call('HGET', KEYS[1], '{JobField.EPOCH}') ~= ARGV[1]
   or redis.call('HGET', KEYS[1], '{JobField.ENDED}') == '1' then
  redis.call('ZREM', KEYS[3], ARGV[2])
  return {{0, 0, 0, 0}}
end
local wrote = tonumber(redis.call('HGET', KEYS[1], '{JobField.SEQ}') or '0')
local still = wrote < tonumber(ARGV[10])
if not still then
  redis.call('HDEL', KEYS[1], '{JobField.CHARGED}', '{JobField.STALLS}', '{JobField.SUSPECT}',
             '{JobField.GROUP}')
end
local was_suspect = redis.call('HGET', KEYS[1], '{JobField.SUSPECT}') == '1'
-- a suspect without a group (an earlier release's reaper marked it) steps alone
local group = tonumber(redis.call('HGET', KEYS[1], '{JobField.GROUP}') or (was_suspect and '1' or '0'))
local stepped = tonumber(ARGV[11])
if still and stepped > 1 and was_suspect then
  local half = math.ceil(stepped / 2)
  if group == 0 or half < group then
    group = half
    redis.call('HSET', KEYS[1], '{JobField.GROUP}', group)
  end
end
local requeues = tonumber(redis.call('HGET', KEYS[1], '{JobField.REQUEUES}') or '0')
if ARGV[9] == '1' and still then requeues = redis.call('HINCRBY', KEYS[1], '{JobField.REQUEUES}', 1) end
local charged = tonumber(redis.call('HGET', KEYS[1], '{JobField.CHARGED}') or '0')
local charge = 0
if ARGV[3] == '1' and still then
  charged = redis.call('HINCRBY', KEYS[1], '{JobField.CHARGED}', 1)
  charge = 1
end
if charged >= tonumber(ARGV[5]) or requeues > tonumber(ARGV[6]) then
  close(ARGV[2], '{JobStatus.FAILED}', ARGV[8], WORKER_LOST, 1)
  return {{2, 0, charge, 0}}
end
if ARGV[4] ~= '0' and still
   and redis.call('HINCRBY', KEYS[1], '{JobField.STALLS}', 1) >= tonumber(ARGV[4])
   and not was_suspect then
  redis.call('HSET', KEYS[1], '{JobField.SUSPECT}', '1', '{JobField.GROUP}', '0')  -- any group
  group = 0
end
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
return {{1, suspect, charge, group}}
"""
)


END = (
    LIB
    + f"""
-- ARGV[1]=final status, ARGV[2]=retention seconds, ARGV[3]=only if the job's status is
-- this ('' = any), ARGV[4]=job id, ARGV[5..]=entry fields without epoch.
-- Returns 1 if this call ended the job, 0 if it was gone, had ended, or had another status.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HGET', KEYS[1], '{JobField.ENDED}') == '1' then return 0 end
if ARGV[3] ~= '' and redis.call('HGET', KEYS[1], '{JobField.STATUS}') ~= ARGV[3] then return 0 end
close(ARGV[4], ARGV[1], ARGV[2], ARGV, 5)
return 1
"""
)


END_IF_LATE = (
    LIB
    + """
-- ARGV[1]=job id, ARGV[2]=retention seconds.
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


def end_args(job_id: str, entry: Failed | Finished, retention_s: int, only_if_status: str = "") -> list[str]:
    """ARGV for END. The script stamps the epoch itself, so the entry's epoch is ignored."""
    return [final_status(entry), str(retention_s), only_if_status, job_id, *_without_epoch(entry)]


def abandon_args(
    job_id: str,
    epoch: int,
    *,
    charge: bool,
    suspect_after: int,
    recovery: Recovery,
    counted: bool = True,
    group: int = 0,
) -> list[str]:
    return [
        str(epoch),
        job_id,
        "1" if charge else "0",
        str(suspect_after),
        str(recovery.max_attempts),
        str(recovery.max_requeues),
        str(int(recovery.resume_wait_s * 1000)),
        str(recovery.retention_s),
        "1" if counted else "0",
        str(1 + recovery.suspect_tokens),
        str(group),
    ]


def end_if_late_args(job_id: str, retention_s: int) -> list[str]:
    return [job_id, str(retention_s)]


def index_keys(cluster: bool) -> list[list[str]]:
    """KEYS for each INDEXES call. On one server, one call takes every shard's running and pending
    index. On a cluster a script may touch one slot only, so there is one call per shard."""
    pairs = [[keys.running(shard), keys.pending(shard)] for shard in range(keys.SHARDS)]
    return pairs if cluster else [[key for pair in pairs for key in pair]]
