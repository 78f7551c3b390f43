"""The scripts a worker runs on its attempt (streams server): CLAIM, APPEND, BEAT, CLEAR_SUSPECT,
FAIL. Each comes with the arguments it takes. (The package docstring says what each does.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contract.entries import Entry, Failed, encode
from contract.keys import JobField, JobStatus
from contract.lua.library import LIB, _flat, _without_epoch, final_status

CLAIM = (
    LIB
    + f"""
-- ARGV[1]=worker name, ARGV[2]=job id, ARGV[3]=heartbeat window ms,
-- ARGV[4]=retention seconds (for a job that it ends as late), ARGV[5]=claim token,
-- ARGV[6]=digest of the spec the worker is about to run
-- Returns {{epoch, cancel, suspect, group}} (group: the most suspects it may step with, 0 for
-- any: contract.lua.jobs.ABANDON): epoch -1 = the job is gone (expired or purged), 0 = it
-- has ended, or had waited too long in the queue (then this call ended it), -2 = the spec is
-- not the one the API recorded (a planted job: nothing is changed), -3 = a live attempt runs
-- it (a queue entry a failover put back: nothing is changed).
local function claimed()
  local suspect = 0
  if redis.call('HGET', KEYS[1], '{JobField.SUSPECT}') == '1' then suspect = 1 end
  -- a suspect marked by an earlier release's reaper has no group: it steps alone
  local group = tonumber(redis.call('HGET', KEYS[1], '{JobField.GROUP}') or tostring(suspect))
  return {{tonumber(redis.call('HGET', KEYS[1], '{JobField.EPOCH}')), cancel_due(KEYS[1]), suspect, group}}
end
if redis.call('EXISTS', KEYS[1]) == 0 then return {{-1, 0, 0, 0}} end
if redis.call('HGET', KEYS[1], '{JobField.ENDED}') == '1' then return {{0, 0, 0, 0}} end
if redis.call('HGET', KEYS[1], '{JobField.DIGEST}') ~= ARGV[6] then return {{-2, 0, 0, 0}} end
if redis.call('HGET', KEYS[1], '{JobField.CLAIM}') == ARGV[5] then return claimed() end
-- running, and its attempt alive: this is a second copy of its queue entry (a failover
-- rolled back the pop that took it), not a job given back
if redis.call('HGET', KEYS[1], '{JobField.STATUS}') == '{JobStatus.RUNNING}'
   and redis.call('EXISTS', KEYS[4]) == 1 then
  return {{-3, 0, 0, 0}}
end
-- a new job past its deadline ends; a requeued one a worker takes now is not late
if tonumber(redis.call('HGET', KEYS[1], '{JobField.ATTEMPTS}') or '0') == 0
   and end_if_late(ARGV[2], ARGV[4]) == 1 then
  return {{0, 0, 0, 0}}
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
    LIB
    + f"""
-- ARGV[1]=epoch, ARGV[2]=final status ('' unless the last entry is terminal),
-- ARGV[3]=retention seconds, ARGV[4]=job id, ARGV[5]=the attempt's number of its
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
-- PEXPIRE first: a write that grows nothing, after which a full Redis (maxmemory, noeviction)
-- takes the SET too (it refuses only a script's first write that may grow memory), so that
-- an attempt still running is not taken for dead and requeued while Redis is full
redis.call('PEXPIRE', KEYS[2], ARGV[2])
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
redis.call('HDEL', KEYS[1], '{JobField.SUSPECT}', '{JobField.CHARGED}', '{JobField.STALLS}',
           '{JobField.GROUP}')
return 1
"""


FAIL = (
    LIB
    + f"""
-- ARGV[1]=epoch, ARGV[2]=claim token, ARGV[3]=retention seconds, ARGV[4]=job id,
-- ARGV[5..]=a Failed entry's fields without the epoch (a few hundred bytes).
-- Ends the attempt's own job with that entry, unless the attempt is no longer current or
-- the job has ended. Returns 1 if this call ended it, else 0.
-- For a Redis that refused the attempt's writes for memory (maxmemory, noeviction): Redis
-- refuses a script only at its first write that may grow memory, never once the script has
-- written (it cannot stop it half-way). So the first write here is a delete (the attempt's
-- alive key, which ending the job deletes anyway), and the small entry after it is taken past
-- maxmemory; ending the job also drops its request.
if redis.call('HGET', KEYS[1], '{JobField.EPOCH}') ~= ARGV[1]
   or redis.call('HGET', KEYS[1], '{JobField.CLAIM}') ~= ARGV[2]
   or redis.call('HGET', KEYS[1], '{JobField.ENDED}') == '1' then
  return 0
end
redis.call('DEL', KEYS[4])
close(ARGV[4], '{JobStatus.FAILED}', ARGV[3], ARGV, 5)
return 1
"""
)


FENCED = "FENCED"
BEHIND = "BEHIND"


@dataclass(frozen=True)
class Claim:
    """What APPEND and BEAT check an attempt's writes against. APPEND also restores it when a
    failover lost the claim. It holds the attempt's epoch, token, worker and heartbeat window."""

    epoch: int
    token: str
    worker: str
    window_ms: int


def append_args(
    job_id: str,
    claim: Claim,
    first_seq: int,
    batch: Sequence[tuple[str, Entry]],
    retention_s: int,
) -> list[str]:
    """ARGV for APPEND: one attempt's entries, in order. The first is the attempt's `first_seq`-th.
    Each has its stream id. For a new one, that is the id the worker chose (`Attempt.next_ids`).
    Only the last may be terminal. Every entry carries the claim's epoch. An empty batch only claims
    again."""
    if claim.epoch < 1 or any(e.epoch != claim.epoch for _, e in batch):
        raise ValueError("APPEND takes entries of one (stamped) attempt")
    if any(final_status(e) for _, e in batch[:-1]):
        raise ValueError("a terminal entry must be the last one")
    out = [
        str(claim.epoch),
        final_status(batch[-1][1]) if batch else "",
        str(retention_s),
        job_id,
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


def fail_args(job_id: str, claim: Claim, entry: Failed, retention_s: int) -> list[str]:
    """ARGV for FAIL (the script stamps the epoch itself, as END does)."""
    return [str(claim.epoch), claim.token, str(retention_s), job_id, *_without_epoch(entry)]


def claim_args(
    worker: str, job_id: str, window_ms: int, retention_s: int, token: str, digest: str
) -> list[str]:
    return [worker, job_id, str(window_ms), str(retention_s), token, digest]
