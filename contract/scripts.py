"""Lua scripts: the only way anything is written to a job's stream.

Each script runs atomically in Redis, so "is this attempt still the current one, has the job
ended, should it stop" is checked in the same step as the write:

- `CLAIM` starts an attempt: bumps the epoch (fencing out any earlier attempt) unless the
  job has ended; returns the new epoch and whether a cancel is due.
- `APPEND` writes one entry for an attempt: refused with a `FENCED` error unless the epoch
  is current and the job has not ended; a terminal entry marks the job ended and starts its
  retention. Returns the entry id and the cancel flag, so a worker learns of a cancel on
  the write it makes anyway.
- `END` lets anyone else (the API, a reaper) end a job with a terminal entry: it bumps the
  epoch so that the running attempt, if any, cannot write another token.

The scripts use only commands Redis 7.0 has, and name every key they touch, both of which
share the completion id's hash tag.
"""

from __future__ import annotations

from contract.entries import EPOCH, Entry, Failed, Finished, encode
from contract.keys import JobField, JobStatus

_CANCEL_DUE = f"""
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
"""

CLAIM = (
    _CANCEL_DUE
    + f"""
-- KEYS[1]=job hash; ARGV[1]=worker name. Returns {{epoch, cancel}}:
-- epoch -1 = the job is gone (expired or purged), 0 = it has ended, or waited too long
-- in the queue (then the caller ends it with queue_timeout: see END).
if redis.call('EXISTS', KEYS[1]) == 0 then return {{-1, 0}} end
if redis.call('HGET', KEYS[1], '{JobField.ENDED}') == '1' then return {{0, 0}} end
local start_by = redis.call('HGET', KEYS[1], '{JobField.START_BY}')
if start_by and redis.call('HGET', KEYS[1], '{JobField.STATUS}') == '{JobStatus.QUEUED}'
   and now_ms() > tonumber(start_by) then
  return {{0, 0}}
end
local epoch = redis.call('HINCRBY', KEYS[1], '{JobField.EPOCH}', 1)
redis.call('HSET', KEYS[1], '{JobField.STATUS}', '{JobStatus.RUNNING}', '{JobField.WORKER}', ARGV[1])
return {{epoch, cancel_due(KEYS[1])}}
"""
)

APPEND = (
    _CANCEL_DUE
    + f"""
-- KEYS[1]=job hash, KEYS[2]=events stream
-- ARGV[1]=epoch, ARGV[2]=final status ('' unless terminal), ARGV[3]=retention seconds,
-- ARGV[4..]=entry field/value pairs. Returns {{entry id, cancel}}.
if redis.call('HGET', KEYS[1], '{JobField.EPOCH}') ~= ARGV[1] then
  return redis.error_reply('FENCED stale attempt')
end
if redis.call('HGET', KEYS[1], '{JobField.ENDED}') == '1' then
  return redis.error_reply('FENCED job ended')
end
local args = {{'XADD', KEYS[2], '*'}}
for i = 4, #ARGV do args[#args + 1] = ARGV[i] end
local id = redis.call(unpack(args))
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], '{JobField.ENDED}', '1', '{JobField.STATUS}', ARGV[2])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  redis.call('EXPIRE', KEYS[2], ARGV[3])
elseif redis.call('PTTL', KEYS[2]) == -1 then
  -- the stream was just created: it lives as long as the job hash
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
end
return {{id, cancel_due(KEYS[1])}}
"""
)

END = f"""
-- KEYS[1]=job hash, KEYS[2]=events stream
-- ARGV[1]=final status, ARGV[2]=retention seconds, ARGV[3]=only if the job's status is
-- this ('' = any), ARGV[4..]=entry fields without epoch.
-- Returns 1 if this call ended the job, 0 if it was gone, had ended, or had another status.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HGET', KEYS[1], '{JobField.ENDED}') == '1' then return 0 end
if ARGV[3] ~= '' and redis.call('HGET', KEYS[1], '{JobField.STATUS}') ~= ARGV[3] then return 0 end
local epoch = redis.call('HINCRBY', KEYS[1], '{JobField.EPOCH}', 1)
local args = {{'XADD', KEYS[2], '*', '{EPOCH}', tostring(epoch)}}
for i = 4, #ARGV do args[#args + 1] = ARGV[i] end
redis.call(unpack(args))
redis.call('HSET', KEYS[1], '{JobField.ENDED}', '1', '{JobField.STATUS}', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
"""

FENCED = "FENCED"


def final_status(entry: Entry) -> str:
    """The job status a terminal entry sets ('' for a non-terminal one)."""
    if isinstance(entry, Finished):
        return JobStatus.DONE
    if isinstance(entry, Failed):
        return JobStatus.FAILED
    return ""


def append_args(entry: Entry, retention_s: int) -> list[str]:
    """ARGV for APPEND (the epoch comes from the entry)."""
    fields = encode(entry)
    flat = [x for pair in fields.items() for x in pair]
    return [str(entry.epoch), final_status(entry), str(retention_s), *flat]


def end_args(entry: Failed | Finished, retention_s: int, only_if_status: str = "") -> list[str]:
    """ARGV for END (the script stamps the epoch itself; the entry's epoch is ignored)."""
    fields = encode(entry)
    del fields[EPOCH]
    flat = [x for pair in fields.items() for x in pair]
    return [final_status(entry), str(retention_s), only_if_status, *flat]
