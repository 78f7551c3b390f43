"""What every job-stream script shares: the Lua functions they begin with and the keys they take
(`job_keys`). It also writes terminal entries as Lua literals.
"""

from __future__ import annotations

from contract import errors, keys
from contract.entries import CANCELLED, EPOCH, Entry, Failed, Finished, encode
from contract.keys import JobField, JobStatus

_LUA_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r"})


def _lua_string(value: str) -> str:
    """A Lua string literal of `value`. (Lua refuses a raw line break or carriage return in one.)"""
    return '"' + value.translate(_LUA_ESCAPES) + '"'


def _lua_fields(entry: Failed) -> str:
    """A terminal entry's fields (without the epoch) as a Lua table literal."""
    return "{" + ", ".join(_lua_string(x) for x in _without_epoch(entry)) + "}"


def _flat(fields: dict[str, str]) -> list[str]:
    return [x for pair in fields.items() for x in pair]


def _without_epoch(entry: Entry) -> list[str]:
    fields = encode(entry)
    del fields[EPOCH]
    return _flat(fields)


# Every per-job script takes KEYS = job_keys(job id).
LIB = f"""
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
-- (unless its endpoint must show it later).
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


def job_keys(job_id: str) -> list[str]:
    """KEYS for every per-job script but BEAT. They are the job hash, events, its shard's running
    index, alive key, and its shard's pending index. They share one hash tag, so one cluster slot."""
    shard = keys.shard(job_id)
    return [
        keys.job(job_id),
        keys.events(job_id),
        keys.running(shard),
        keys.alive(job_id),
        keys.pending(shard),
    ]


def final_status(entry: Entry) -> str:
    """The job status a terminal entry sets ('' for a non-terminal one)."""
    if isinstance(entry, Finished):
        return JobStatus.CANCELLED if entry.finish_reason == CANCELLED else JobStatus.DONE
    if isinstance(entry, Failed):
        return JobStatus.FAILED
    return ""
