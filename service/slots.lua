-- slots.lua: concurrency slots (slots.go), one call over one or more slot
-- tables, atomic. It runs alone (not after bucket.lua).
--
-- KEYS[i]            the Redis key of slot table i (a sorted set)
-- ARGV[1]            the operation: acquire, renew or release
-- ARGV[2]            the caller's name
-- ARGV[3]            the lease, milliseconds (0 for release)
-- ARGV[2i+2 .. 2i+3] the slot id and max_in_flight of table i
--
-- A table holds one member per slot out, "<caller> <id>", scored with the
-- time its lease ends (Redis's TIME, Unix milliseconds). Every operation
-- first drops the table's expired members (score <= now), so an expired
-- slot counts nowhere. A table with no member is gone (Redis deletes an
-- empty sorted set); any other has an expiry no earlier than its last
-- lease's end, so an idle table leaves nothing.
--
-- acquire: if every table holds fewer than its max_in_flight members, or
-- already holds the caller's id, the id takes (or renews) a slot in every
-- table; otherwise none is taken. Returns {all, in_flight_1, ...}: the
-- members of each table after the call.
-- renew: each slot the caller holds is pushed to now + lease (1, held); one
-- gone is taken again when its table has room (2, restored), else not (3,
-- lost). release: each slot the caller holds is removed (1), one gone is
-- not there to remove (3). Returns {state_1, ...}.

if redis.replicate_commands then
  redis.replicate_commands()
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op, caller, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
local n = #KEYS

local function member(i)
  return caller .. ' ' .. ARGV[2 * i + 2]
end

local function max(i)
  return tonumber(ARGV[2 * i + 3])
end

-- take gives member m of table key a lease to now + lease, and the table an
-- expiry no earlier than that.
local function take(key, m)
  redis.call('ZADD', key, now + lease, m)
  if redis.call('PTTL', key) < lease then
    redis.call('PEXPIRE', key, lease)
  end
end

local out = {}
if op == 'acquire' then
  local all, counts, held = 1, {}, {}
  for i = 1, n do
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
    counts[i] = redis.call('ZCARD', KEYS[i])
    held[i] = redis.call('ZSCORE', KEYS[i], member(i))
    if not held[i] and counts[i] >= max(i) then
      all = 0
    end
  end
  out[1] = all
  for i = 1, n do
    if all == 1 then
      take(KEYS[i], member(i))
      if not held[i] then
        counts[i] = counts[i] + 1
      end
    end
    out[i + 1] = counts[i]
  end
  return out
end

for i = 1, n do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  local m = member(i)
  local held = redis.call('ZSCORE', KEYS[i], m)
  if op == 'release' then
    if held then
      redis.call('ZREM', KEYS[i], m)
      out[i] = 1
    else
      out[i] = 3
    end
  elseif held then
    take(KEYS[i], m)
    out[i] = 1
  elseif redis.call('ZCARD', KEYS[i]) < max(i) then
    take(KEYS[i], m)
    out[i] = 2
  else
    out[i] = 3
  end
end
return out
