-- decide.lua: one atomic decision over one or more token buckets.
--
-- KEYS[i]            the Redis key of bucket i (all keys share one hash tag)
-- ARGV[3i-2 .. 3i]   rate (tokens per second), burst, cost of bucket i
--
-- Each key holds a string "<tokens> <at>": the tokens left (a float, printed
-- with 17 significant digits so it reads back bit for bit) at time <at> (Unix
-- microseconds). A missing key is a full bucket, like the zero bucket.State.
-- The arithmetic mirrors package bucket (Tokens and Take) operation for
-- operation, in nanoseconds, so both give bit-identical tokens: keep them in
-- step. The clock is Redis's own TIME; times are kept in microseconds because
-- Unix nanoseconds do not fit a double exactly, while elapsed nanoseconds do.
--
-- Either every bucket admits its cost and all are consumed, or nothing is
-- written. A consumed bucket that is full again at once is deleted; any other
-- gets an expiry of the time it needs to be full again, rounded up to whole
-- milliseconds plus one (Redis expires against a millisecond clock taken when
-- the script starts, which may be up to a millisecond behind TIME), so a key
-- vanishes only once the bucket package would compute it as full.
--
-- Returns {all, ok_1, tokens_1, gap_1, ..., ok_n, tokens_n, gap_n}: all is 1
-- when the request was admitted; ok_i is 1 when bucket i alone had enough
-- tokens; tokens_i (a string) is what bucket i holds after the decision
-- (after consumption when admitted, refilled but untouched otherwise); gap_i
-- is the nanoseconds by which the bucket's time is ahead of TIME (non-zero only
-- when the clock went backwards).

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

local n = #KEYS
local rates, bursts, costs, tokens, ats = {}, {}, {}, {}, {}
local all = 1
local ok = {}
for i = 1, n do
  local rate = tonumber(ARGV[3 * i - 2])
  local burst = tonumber(ARGV[3 * i - 1])
  local cost = tonumber(ARGV[3 * i])
  if cost < 0 then
    cost = 0
  end
  local slack = rate * 1e-9 + 1e-12 * burst
  local tok = burst
  local at = now
  local v = redis.call('GET', KEYS[i])
  if v then
    local sp = string.find(v, ' ', 1, true)
    local stored = sp and tonumber(string.sub(v, 1, sp - 1))
    local stored_at = sp and tonumber(string.sub(v, sp + 1))
    if not stored or not stored_at then
      return redis.error_reply('limitd: malformed bucket value at ' .. KEYS[i])
    end
    tok = stored
    if not (tok > 0) then
      tok = 0
    elseif tok > burst then
      tok = burst
    end
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
  end
  rates[i], bursts[i], costs[i], tokens[i], ats[i] = rate, burst, cost, tok, at
  if cost <= burst and tok + slack >= cost then
    ok[i] = 1
  else
    ok[i] = 0
    all = 0
  end
end

if all == 1 then
  for i = 1, n do
    local tok = tokens[i] - costs[i]
    if tok < 0 then
      tok = 0
    end
    tokens[i] = tok
    local fill = full_in(tok, rates[i], bursts[i])
    if fill == 0 and ats[i] == now then
      redis.call('DEL', KEYS[i])
    else
      local ttl = math.ceil(((ats[i] - now) * 1000 + fill) / 1000000) + 1
      redis.call('SET', KEYS[i], string.format('%.17g %.17g', tok, ats[i]), 'PX', ttl)
    end
  end
end

local out = {all}
for i = 1, n do
  out[#out + 1] = ok[i]
  out[#out + 1] = string.format('%.17g', tokens[i])
  out[#out + 1] = (ats[i] - now) * 1000
end
return out
