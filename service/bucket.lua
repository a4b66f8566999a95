-- bucket.lua: what decide.lua and lease.lua share, run before either (the
-- service prepends it): Redis's clock, and reading and writing one token
-- bucket.
--
-- Each key holds a string "<tokens> <at>": the tokens left (a float, printed
-- with 17 significant digits so it reads back bit for bit) at time <at> (Unix
-- microseconds). A missing key is a full bucket, like the zero bucket.State.
-- The arithmetic mirrors package bucket (Tokens, Take, Lease) operation for
-- operation, in nanoseconds, so both give bit-identical tokens: keep them in
-- step. The clock is Redis's own TIME; times are kept in microseconds because
-- Unix nanoseconds do not fit a double exactly, while elapsed nanoseconds do.
--
-- A bucket written full at once is deleted; any other gets an expiry of the
-- time it needs to be full again, rounded up to whole milliseconds plus one
-- (Redis expires against a millisecond clock taken when the script starts,
-- which may be up to a millisecond behind TIME), so a key vanishes only once
-- the bucket package would compute it as full.

-- Redis before 5 replicates scripts verbatim and refuses writes after TIME
-- unless effects replication is on; from 7 on this is a no-op.
if redis.replicate_commands then
  redis.replicate_commands()
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- refill_in: whole nanoseconds (rounded up) to refill x tokens at rate.
local function refill_in(x, rate)
  if not (x > 0) then
    return 0
  end
  return math.ceil(x / rate * 1000000000)
end

-- full_in: nanoseconds of refill that take tok to within relSlack × burst of
-- burst (bucket's fullIn).
local function full_in(tok, rate, burst)
  return refill_in(burst - tok - 1e-12 * burst, rate)
end

-- slack: the shortfall package bucket forgives (Limit.slack).
local function slack(rate, burst)
  return rate * 1e-9 + 1e-12 * burst
end

-- load reads the bucket at key and refills it to now: its tokens, and its
-- own time (now, or later when the clock went backwards).
local function load(key, rate, burst)
  local v = redis.call('GET', key)
  if not v then
    return burst, now
  end
  local sp = string.find(v, ' ', 1, true)
  local stored = sp and tonumber(string.sub(v, 1, sp - 1))
  local stored_at = sp and tonumber(string.sub(v, sp + 1))
  if not stored or not stored_at then
    return nil, redis.error_reply('limitd: malformed bucket value at ' .. key)
  end
  -- Negative tokens are a debt left by charge.lua, at most a burst
  -- (bucket's level).
  local tok = stored
  if tok ~= tok then
    tok = 0
  elseif tok < -burst then
    tok = -burst
  elseif tok > burst then
    tok = burst
  end
  local at = now
  if stored_at > now then
    at = stored_at
  end
  local elapsed = (now - stored_at) * 1000
  if elapsed > 0 then
    local refilled = tok + rate * elapsed / 1000000000
    if refilled < burst * 0.999999999998 then -- burst × (1 − 2 relSlack)
      tok = refilled
    elseif elapsed >= full_in(tok, rate, burst) then
      tok = burst
    elseif refilled < burst then
      tok = refilled
    else
      tok = burst
    end
  end
  return tok, at
end

-- store writes tok at time at into the bucket at key, with the expiry
-- described above, or deletes it when it is full at once.
local function store(key, tok, at, rate, burst)
  local fill = full_in(tok, rate, burst)
  if fill == 0 and at == now then
    redis.call('DEL', key)
  else
    local ttl = math.ceil(((at - now) * 1000 + fill) / 1000000) + 1
    redis.call('SET', key, string.format('%.17g %.17g', tok, at), 'PX', ttl)
  end
end

