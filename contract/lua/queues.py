"""The queues server's scripts that are no accounting. They cover a model's queues (RESERVE, TAKE,
TAKEN_DATA) and a routed job falling back to the shared queue. They also cover a key's bound on its
routed jobs, a dead worker's batch size, a lock, and a compare-and-delete.
"""

from __future__ import annotations

from collections.abc import Sequence

from contract import keys

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


TAKE = f"""
-- KEYS[1..n-1]=a model's queue lists in the order to take from, KEYS[n]=the worker's inbox
-- ARGV[1]=which of KEYS is the suspect queue (0: none), ARGV[2]=how many suspects the
-- worker would then step together, ARGV[3]=the prefix of RQ's job records, ARGV[4]=how the
-- keys take turns: 0 not at all (first come, first taken), 1 the job of the key with the
-- fewest jobs running here, 2 only a job of a key with none running here (an embedding
-- worker's guest slot); ARGV[5]=how many waiting jobs of each queue may be looked at,
-- ARGV[6..]=the owners of the jobs running here, one a job. From the suspect queue it takes
-- the first job whose record's group (the most suspects it may step with:
-- contract.lua.jobs.ABANDON; none: 1, an earlier release's) allows that many, among the first
-- 64 waiting. With turns, of the first ARGV[5] waiting in a queue it takes the oldest job of
-- the owner (its record's, written with the push) with the fewest running here: a key whose
-- jobs hold the worker's slots waits behind another's one job, and keys with as many running
-- go first come, first taken. The records are read by name: the queues server is one server.
-- Returns {{queue key, RQ job id, owner}} or false when no queue has a job to take.
local inbox = KEYS[#KEYS]
local t = redis.call('TIME')
local need = tonumber(ARGV[2])
local turns = tonumber(ARGV[4] or '0')
local running = {{}}
for i = 6, #ARGV do running[ARGV[i]] = (running[ARGV[i]] or 0) + 1 end
for i = 1, #KEYS - 1 do
  local id, owner = false, ''
  local grouped = i == tonumber(ARGV[1]) and need > 1
  if grouped or turns > 0 then
    local least = math.huge
    local window = turns > 0 and math.max(tonumber(ARGV[5]), 1) or 64
    for _, queued in ipairs(redis.call('LRANGE', KEYS[i], 0, window - 1)) do
      local record = ARGV[3] .. queued
      local ok = true
      if grouped then
        local group = tonumber(redis.call('HGET', record, '{keys.JobField.GROUP}') or '1')
        ok = group == 0 or group >= need
      end
      if ok then
        local who = turns > 0 and (redis.call('HGET', record, '{keys.JobField.OWNER}') or '') or ''
        local n = running[who] or 0
        if n < least and (turns ~= 2 or n == 0) then id, owner, least = queued, who, n end
        if least == 0 or turns == 0 then break end
      end
    end
    if id then redis.call('LREM', KEYS[i], 1, id) end
  else
    id = redis.call('LPOP', KEYS[i])
  end
  if id then
    redis.call('HSET', inbox, id, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
    return {{KEYS[i], id, owner}}
  end
end
return false
"""
TAKEN_DATA = """#!lua flags=allow-oom
-- KEYS[1]=the RQ record of a job the worker took. Returns its data (nil: the job is gone).
-- It only reads, but it is declared as a script that may write (no `no-writes` flag), so
-- that only a primary runs it: a replica refuses it with READONLY. Behind one name, a
-- connection opened before a failover still reaches the demoted primary, which answers
-- reads from its own data until its resync ends (seconds), and lacks the jobs queued on the
-- new primary since: read there, a job just taken would be dropped as gone.
-- `allow-oom`: a full Redis still lets a worker read its jobs, as a plain HGET would.
return redis.call('HGET', KEYS[1], 'data')
"""
# waiting jobs of a queue TAKE looks at for another key's (MAX_JOBS_PER_KEY is 64)
TURNS_WINDOW = 256


def take_keys(queue_names: Sequence[str], worker: str) -> list[str]:
    """KEYS for TAKE: the lists of the queues named, in order, then the worker's inbox."""
    return [*(keys.rq_queue_key(name) for name in queue_names), keys.inbox(worker)]


def take_args(
    queue_names: Sequence[str],
    suspect_queue: str,
    stepping: int,
    owners: Sequence[str] | None = None,
    guest: bool = False,
) -> list[str | int]:
    """ARGV for TAKE. It says where the suspect queue is among `queue_names`, if at all. It says how
    many suspects a worker holding `stepping` of them would step with one more. `owners` are the
    keys of the jobs running here (an embedding worker's). With them, keys take turns. A `guest`
    slot takes only a job of a key with none running here."""
    at = queue_names.index(suspect_queue) + 1 if suspect_queue in queue_names else 0
    turns = 0 if owners is None else 2 if guest else 1
    return [at, stepping + 1, keys.rq_job(""), turns, TURNS_WINDOW, *(owners or ())]


FALL_BACK = """
-- KEYS[1]=the worker's routed queue, KEYS[2]=the tier's shared queue, KEYS[3]=the model's
-- wake list, KEYS[4]=the routed index, KEYS[5]=the stats hash; ARGV[1]=the RQ job id,
-- ARGV[2]=its index member, ARGV[3]=the stats field, ARGV[4]=the prefix of RQ's job records.
-- Returns 1 if the job went back to the shared queue, 0 if its worker had taken it (or it
-- ended). It goes back where its arrival puts it: before the first job that came after it
-- (RQ's `enqueued_at`, UTC to the microsecond, sorts as text), else last; never ahead of
-- another key's earlier job. The walk is as long as the tier's queue, which MAX_QUEUE_DEPTH
-- bounds; a fallback is rare. The records are read by name: the queues server is one server
-- (a cluster is refused as REDIS_URL).
redis.call('ZREM', KEYS[4], ARGV[2])
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
local arrived = redis.call('HGET', ARGV[4] .. ARGV[1], 'enqueued_at')
local placed = 0
if arrived then
  for _, id in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
    local at = redis.call('HGET', ARGV[4] .. id, 'enqueued_at')
    if at and at > arrived then
      placed = redis.call('LINSERT', KEYS[2], 'BEFORE', id, ARGV[1])
      break
    end
  end
end
if placed <= 0 then redis.call('RPUSH', KEYS[2], ARGV[1]) end
redis.call('LPUSH', KEYS[3], 1)
redis.call('LTRIM', KEYS[3], 0, 63)
redis.call('HINCRBY', KEYS[5], ARGV[3], 1)
return 1
"""


# KEYS=the dead worker's records (its jobs, its uncleared suspects); ARGV=how many of each it
# holds now. Returns the most of each it held over the last 15 s: one death's attempts are all
# found dead within a heartbeat window, and a worker frozen and thawed that dies again later is
# judged afresh.
DEAD_BATCH = """
local most = {}
for i = 1, #KEYS do
  local seen = tonumber(redis.call('GET', KEYS[i]) or '0')
  if tonumber(ARGV[i]) > seen then
    seen = tonumber(ARGV[i])
    redis.call('SET', KEYS[i], seen, 'EX', 15)
  end
  most[i] = seen
end
return most
"""


# KEYS[1]=a key; ARGV[1]=a value. Deletes the key if it still holds that value.
DELETE_IF = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


# KEYS[1]=the lock; ARGV[1]=the holder; ARGV[2]=ms. Takes the lock, or extends it for its holder.
TAKE_OR_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) and 1 or 0
"""


ROUTE_FOR_OWNER = """
-- KEYS[1]=the owner's routed jobs (member -> ms when routed), KEYS[2]=the model's `routed`
-- ARGV[1]=the new job's `routed` member, ARGV[2]=the most the owner may have waiting routed,
-- ARGV[3]=ms a routed job may wait at most. Returns 1 (it may be routed: counted) or 0 (it
-- waits in the shared queue). A job counts until its worker takes it or it falls back (its
-- `routed` entry goes; one routed in the last 5 s may not have that entry yet).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[3]))
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - 5000)) do
  if not redis.call('ZSCORE', KEYS[2], member) then redis.call('ZREM', KEYS[1], member) end
end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""
