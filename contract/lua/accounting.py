"""What an API key's owner is charged (queues server). ADMIT counts a new job against its limits,
and other scripts charge for what it keeps.

Per-minute budgets (requests, bytes, tokens) are counters of the minute since the epoch. A job
reserves the most its prompt can be and its `max_tokens` in ADMIT. SETTLE runs once per job when it
ends, and corrects the count to what it used. So a job is never charged twice, however often it was
resumed or read.

Everything a key makes the server keep for a while is a charge against FILES_BYTES_PER_KEY. Charges
cover its uploaded files. They cover its batches' copies of their lines, and their answered lines,
while they run. They also cover the output and error files the batches end with. Each charge is an entry
of the owner's `FILE_SIZES` hash (`<id>` -> `"<bytes> <expires at, s>"`). The charges are listed by
expiry in `FILE_EXPIRY`, and their sum is kept in `FILE_HELD`. A charge is checked and made in the
same step as the write it pays for. So concurrent requests on any replica cannot overshoot the
budget. Neither costs more than a few commands, however many files the owner has. Expired charges
are dropped a hundred at a time as later ones are made.

- `ADMIT` counts a new job against its owner's unfinished jobs and per-minute budgets.
- `SETTLE` turns a job's reservation into its usage.
- `SPEND` counts one request of some bytes against its owner's per-minute budgets. These are the
  ones ADMIT counts jobs against. It runs before the request's heavy work, so a refused upload or
  batch is not parsed at all.
- `STORE_FILE` stores a file unless its owner would then hold more bytes or files than allowed. An
  output file, whose content was appended in pieces, is charged whatever the budget. The work is
  done, so the owner's next upload is refused instead.
- `DELETE_FILE` deletes a file and gives its bytes back.
- `CREATE_BATCH` records a batch and its lines. It does not if its owner already runs the most
  batches allowed, or if the lines would exceed the budget.
- `ANSWER` records a batch line's answer once (line -> output line). It counts it, and charges its
  bytes to the batch's owner.
- `RELEASE` gives back charges (a batch's lines and answers, once its files are written).
- `SET_STATUS` changes a batch's status only from the statuses it names. It is compare and set, so
  a cancel and the driver cannot undo each other's change.
- `FINALIZE` begins a batch's end, as SET_STATUS does. It does so only if no line is open and (for a
  batch that completes) every line was sent.
"""

from __future__ import annotations

from contract import keys

ADMIT = """
-- KEYS[1]=the owner's unfinished jobs, KEYS[2]=the idempotency key, KEYS[3]=the owner's
-- requests this minute, KEYS[4]=their bytes, KEYS[5]=their tokens, KEYS[6]=the owner's
-- reserved tokens (each KEYS[1] again where it does not apply)
-- ARGV[1]=job id, ARGV[2]="<job id> <request digest>" ('' without a key),
-- ARGV[3]=ttl seconds of an unfinished job, ARGV[4]=max unfinished jobs of the owner,
-- ARGV[5]=max requests per minute, ARGV[6]=max bytes per minute, ARGV[7]=this request's bytes,
-- ARGV[8]='1' if the job counts among the owner's unfinished, ARGV[9]=max tokens per minute
-- (each max 0: no limit), ARGV[10]=the tokens this job reserves (0: none),
-- ARGV[11]=the prompt's bound among them, ARGV[12]=this minute (since the epoch).
-- Returns {'new', requests, tokens} (this minute's, the job counted),
-- {'held', "<id> <digest>"} (the key names a job: the caller decides), {'limit', unfinished}
-- or {'rate', 'requests' or 'bytes' or 'tokens', requests, tokens}. Nothing is written
-- before the last check.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[2] ~= '' then
  local held = redis.call('GET', KEYS[2])
  if held then return {'held', held} end
end
if tonumber(ARGV[4]) > 0 and ARGV[8] == '1' then
  -- a job older than its ttl has expired, ended or not: it no longer counts
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[3]) * 1000)
  local unfinished = redis.call('ZCARD', KEYS[1])
  if unfinished >= tonumber(ARGV[4]) then return {'limit', unfinished} end
end
local max_requests, max_bytes, max_tokens = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[9])
local requests, tokens = 0, 0
if max_requests > 0 then requests = tonumber(redis.call('GET', KEYS[3]) or '0') end
if max_tokens > 0 then tokens = tonumber(redis.call('GET', KEYS[5]) or '0') end
if max_requests > 0 and requests >= max_requests then return {'rate', 'requests', requests, tokens} end
if max_bytes > 0 and tonumber(redis.call('GET', KEYS[4]) or '0') + tonumber(ARGV[7]) > max_bytes then
  return {'rate', 'bytes', requests, tokens}
end
local reserve = max_tokens > 0 and tonumber(ARGV[10]) > 0
if reserve and tokens + tonumber(ARGV[10]) > max_tokens then return {'rate', 'tokens', requests, tokens} end
if max_requests > 0 then
  requests = redis.call('INCR', KEYS[3])
  redis.call('EXPIRE', KEYS[3], 120)
end
if max_bytes > 0 then
  redis.call('INCRBY', KEYS[4], ARGV[7])
  redis.call('EXPIRE', KEYS[4], 120)
end
if reserve then
  tokens = redis.call('INCRBY', KEYS[5], ARGV[10])
  redis.call('EXPIRE', KEYS[5], 120)
  redis.call('HSET', KEYS[6], ARGV[1], ARGV[12] .. ' ' .. ARGV[10] .. ' ' .. ARGV[11])
  redis.call('EXPIRE', KEYS[6], ARGV[3])
end
if ARGV[8] == '1' then
  redis.call('ZADD', KEYS[1], now, ARGV[1])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
end
if ARGV[2] ~= '' then redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3]) end
return {'new', requests, tokens}
"""


SETTLE = """
-- KEYS[1]=the owner's reserved tokens, KEYS[2]=its tokens this minute
-- ARGV[1]=job id, ARGV[2]=this minute, ARGV[3]=the tokens the job used ('' to charge its
-- prompt's bound: it failed, its usage unknown; '-': the whole reservation, the job is gone).
-- Once per job: its reservation becomes what it used. Reserved in this minute, this minute's
-- count is corrected either way; reserved in an earlier one (whose count no longer limits
-- anything), what it used beyond its reservation is charged to this minute, never dropped.
-- Returns the tokens charged, or -1 if nothing was reserved (settled already, or never).
local held = redis.call('HGET', KEYS[1], ARGV[1])
if not held then return -1 end
redis.call('HDEL', KEYS[1], ARGV[1])
local minute, reserved, prompt = string.match(held, '^(%d+) (%d+) (%d+)$')
local used = tonumber(ARGV[3]) or tonumber(prompt)
if ARGV[3] == '-' then used = tonumber(reserved) end
local change = used - tonumber(reserved)
if minute == ARGV[2] and redis.call('EXISTS', KEYS[2]) == 1 then
  local left = redis.call('INCRBY', KEYS[2], change)
  if left < 0 then redis.call('SET', KEYS[2], 0, 'KEEPTTL') end
elseif minute ~= ARGV[2] and change > 0 then
  redis.call('INCRBY', KEYS[2], change)
  redis.call('EXPIRE', KEYS[2], 120)
end
return used
"""


_LIB = """
local function now_s() return tonumber(redis.call('TIME')[1]) end
-- KEYS of the owner's charges are passed as H = {sizes, expiry, held, files}
local function release(H, id)
  local entry = redis.call('HGET', H[1], id)
  if entry then
    redis.call('DECRBY', H[3], tonumber(string.match(entry, '^(%d+)')))
    redis.call('HDEL', H[1], id)
  end
  redis.call('ZREM', H[2], id)
  redis.call('ZREM', H[4], id)
end
-- The bytes the owner holds now: expired charges dropped (a hundred at most per call).
local function settle(H)
  if redis.call('EXISTS', H[3]) == 0 then
    -- sizes written before the sum was kept: summed once
    local total, all = 0, redis.call('HGETALL', H[1])
    for i = 1, #all, 2 do
      local size, expires = string.match(all[i + 1], '^(%d+) (%d+)')
      redis.call('ZADD', H[2], expires, all[i])
      total = total + tonumber(size)
    end
    redis.call('SET', H[3], total)
  end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', H[2], '-inf', now_s(), 'LIMIT', 0, 100)) do
    release(H, id)
  end
  return tonumber(redis.call('GET', H[3]))
end
-- Add `bytes` to the charge `id`, which lasts until `expires`.
local function charge(H, id, bytes, expires)
  local entry = redis.call('HGET', H[1], id)
  local size = tonumber(bytes)
  if entry then size = size + tonumber(string.match(entry, '^(%d+)')) end
  redis.call('HSET', H[1], id, size .. ' ' .. expires)
  redis.call('ZADD', H[2], expires, id)
  redis.call('INCRBY', H[3], bytes)
end
"""


def charge_keys(owner: str) -> list[str]:
    """The owner's charges, as every script here takes them (after its own keys). They are sizes,
    expiry, held, files."""
    return [
        keys.owned(owner, keys.OwnerIndex.FILE_SIZES),
        keys.owned(owner, keys.OwnerIndex.FILE_EXPIRY),
        keys.owned(owner, keys.OwnerIndex.FILE_HELD),
        keys.owned(owner, keys.OwnerIndex.FILES),
    ]


SPEND = """
-- KEYS[1]=the owner's requests this minute, KEYS[2]=their bytes
-- ARGV[1]=max requests per minute, ARGV[2]=max bytes per minute (each 0: no limit),
-- ARGV[3]=this request's bytes. Returns {'ok'} or {'rate', 'requests' or 'bytes'}.
if tonumber(ARGV[1]) > 0 and tonumber(redis.call('GET', KEYS[1]) or '0') >= tonumber(ARGV[1]) then
  return {'rate', 'requests'}
end
if tonumber(ARGV[2]) > 0
   and tonumber(redis.call('GET', KEYS[2]) or '0') + tonumber(ARGV[3]) > tonumber(ARGV[2]) then
  return {'rate', 'bytes'}
end
if tonumber(ARGV[1]) > 0 then
  redis.call('INCR', KEYS[1])
  redis.call('EXPIRE', KEYS[1], 120)
end
if tonumber(ARGV[2]) > 0 then
  redis.call('INCRBY', KEYS[2], ARGV[3])
  redis.call('EXPIRE', KEYS[2], 120)
end
return {'ok'}
"""


STORE_FILE = (
    _LIB
    + """
-- KEYS[1]=file hash, KEYS[2]=its content, KEYS[3..6]=the owner's charges
-- ARGV[1]=file id, ARGV[2]=bytes, ARGV[3]=expires at (s), ARGV[4]=created (s),
-- ARGV[5]=the owner's byte budget, ARGV[6]=the most files it may hold (each 0: no limit, and
-- an output file is stored with 0, 0 whatever it holds), ARGV[7]='1' if the content is the
-- last ARGV, '0' if it is in KEYS[2] already (appended in pieces), ARGV[8..]=the file hash's
-- fields and values. Returns {'new'}, {'quota', bytes held} or {'files', files held}.
local H = {KEYS[3], KEYS[4], KEYS[5], KEYS[6]}
local held = settle(H)
if tonumber(ARGV[5]) > 0 and held + tonumber(ARGV[2]) > tonumber(ARGV[5]) then return {'quota', held} end
local files = redis.call('ZCARD', KEYS[6])
if tonumber(ARGV[6]) > 0 and files >= tonumber(ARGV[6]) then return {'files', files} end
local last = #ARGV
if ARGV[7] == '1' then
  redis.call('SET', KEYS[2], ARGV[last])
  last = last - 1
end
local fields = {'HSET', KEYS[1]}
for i = 8, last do fields[#fields + 1] = ARGV[i] end
redis.call(unpack(fields))
redis.call('EXPIREAT', KEYS[1], ARGV[3])
redis.call('EXPIREAT', KEYS[2], ARGV[3])
redis.call('ZADD', KEYS[6], ARGV[4], ARGV[1])
charge(H, ARGV[1], ARGV[2], ARGV[3])
return {'new'}
"""
)


DELETE_FILE = (
    _LIB
    + """
-- KEYS[1]=file hash, KEYS[2]=its content, KEYS[3..6]=the owner's charges; ARGV[1]=file id.
release({KEYS[3], KEYS[4], KEYS[5], KEYS[6]}, ARGV[1])
return redis.call('DEL', KEYS[1], KEYS[2])
"""
)


CREATE_BATCH = (
    _LIB
    + """
-- KEYS[1]=batch hash, KEYS[2]=its lines, KEYS[3]=the owner's batches (id -> created ms),
-- KEYS[4]=the batches being driven, KEYS[5]=the owner's running batches (id -> created ms),
-- KEYS[6..9]=the owner's charges
-- ARGV[1]=batch id, ARGV[2]=created (ms), ARGV[3]=max running batches of the owner (0: no
-- limit), ARGV[4]=ms after which a running entry is stale (its batch long ended),
-- ARGV[5]=the owner's byte budget (0: none), ARGV[6]=the lines' charge id, ARGV[7]=their
-- bytes, ARGV[8]=when their charge expires (s), ARGV[9]=number of lines n,
-- ARGV[10..9+n]=the lines, then the hash's fields and values.
-- Returns {'new'}, {'batches', running} or {'quota', bytes held}: the checks and the record
-- are one step.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now - tonumber(ARGV[4]))
local running = redis.call('ZCARD', KEYS[5])
if tonumber(ARGV[3]) > 0 and running >= tonumber(ARGV[3]) then return {'batches', running} end
local H = {KEYS[6], KEYS[7], KEYS[8], KEYS[9]}
local held = settle(H)
if tonumber(ARGV[5]) > 0 and held + tonumber(ARGV[7]) > tonumber(ARGV[5]) then return {'quota', held} end
local n = tonumber(ARGV[9])
for i = 10, 9 + n, 1000 do
  redis.call('RPUSH', KEYS[2], unpack(ARGV, i, math.min(i + 999, 9 + n)))
end
local fields = {'HSET', KEYS[1]}
for i = 10 + n, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call(unpack(fields))
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[5], ARGV[2], ARGV[1])
charge(H, ARGV[6], ARGV[7], ARGV[8])
return {'new'}
"""
)


ANSWER = (
    _LIB
    + """
-- KEYS[1]=the batch's results, KEYS[2]=its open lines, KEYS[3]=the batch hash,
-- KEYS[4..7]=the owner's charges
-- ARGV[1]=line, ARGV[2]=its output line, ARGV[3]=the counter it adds to, ARGV[4]=input
-- tokens, ARGV[5]=output tokens, ARGV[6]=the results' charge id, ARGV[7]=when it expires (s).
-- Records the answer once (a driver that dies after this call answers nothing twice).
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('HINCRBY', KEYS[3], ARGV[3], 1)
  redis.call('HINCRBY', KEYS[3], 'input_tokens', ARGV[4])
  redis.call('HINCRBY', KEYS[3], 'output_tokens', ARGV[5])
  local H = {KEYS[4], KEYS[5], KEYS[6], KEYS[7]}
  settle(H)
  charge(H, ARGV[6], string.len(ARGV[2]), ARGV[7])
end
return redis.call('HDEL', KEYS[2], ARGV[1])
"""
)


RELEASE = (
    _LIB
    + """
-- KEYS[1..4]=the owner's charges; ARGV=the charge ids to give back.
for _, id in ipairs(ARGV) do release(KEYS, id) end
return settle(KEYS)
"""
)


SET_STATUS = """
-- KEYS[1]=a batch hash; ARGV[1]=the statuses it may change from, space-separated, then its
-- fields and values (the new 'status' among them). Returns 1 if it changed, else the status.
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 0 end
for allowed in string.gmatch(ARGV[1], '%S+') do
  if allowed == status then
    local fields = {'HSET', KEYS[1]}
    for i = 2, #ARGV do fields[#fields + 1] = ARGV[i] end
    redis.call(unpack(fields))
    return 1
  end
end
return status
"""


def lines_charge(batch_id: str) -> str:
    """The charge id of a running batch's copy of its lines."""
    return f"{batch_id}:lines"


def results_charge(batch_id: str) -> str:
    """The charge id of a running batch's answered lines."""
    return f"{batch_id}:results"


FINALIZE = """
-- KEYS[1]=a batch hash, KEYS[2]=its open lines (line -> job id); ARGV[1]=the status it ends
-- from, ARGV[2]='1' if it completes (every line must have been sent), then its fields and
-- values (status 'finalizing' among them). Returns 1 if it changed, else the status, or
-- 'open' (a line is still open) or 'unsent' (a line was never sent). The driver decided from
-- what it read, and a read may reach a demoted primary: behind one name, a connection opened
-- before a failover still reaches it, and it answers from its own data until its resync ends
-- (seconds), data the new primary may lack. This write runs on the primary only, so it checks
-- again there.
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= ARGV[1] then return status or 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 'open' end  -- a hash without fields is no key
if ARGV[2] == '1' then
  local sent = tonumber(redis.call('HGET', KEYS[1], 'next') or '0')
  if sent < tonumber(redis.call('HGET', KEYS[1], 'total') or '0') then return 'unsent' end
end
local fields = {'HSET', KEYS[1]}
for i = 3, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call(unpack(fields))
return 1
"""
