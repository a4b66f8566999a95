-- bucket.lua: what decide.lua and lease.lua share, run before either (the
-- service prepends it): Redis's clock, and reading and writing one token
-- bucket.
--
-- Each key holds a string "<tokens> <at>": the tokens left (a float, printed
-- with 17 significant digits so it reads back bit for bit) at time <at> (Unix
-- microseconds). A missing key is a full bucket, like the zero bucket.State.
-- A bucket with a ledger (ledger.go: what leases granted and decisions
-- reserved, that a return or a refund may give back) holds
-- "<tokens> <at> <gen> <lease_cur> <lease_prev> <resv_cur> <resv_prev>
-- <returned>": gen is the index of the ledger window (Unix microseconds /
-- window), then the two generations of each side, and the returns taken back
-- in the current window (at most a burst). The window, in microseconds, is
-- every script's last ARGV.
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
local window = tonumber(ARGV[#ARGV])
local gen = math.floor(now / window)

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

-- give takes up to x (>= 0) from one side of led ('l' leases, 'r'
-- reservations), previous generation first, and returns what it took
-- (ledger.go's give).
local function give(led, side, x)
  if not (x > 0) then
    return 0
  end
  local took = 0
  for _, k in ipairs({side .. '1', side .. '0'}) do
    local d = math.min(x - took, led[k])
    if d > 0 then
      led[k] = led[k] - d
      took = took + d
    end
  end
  return took
end

-- take_return takes back up to ret (>= 0) of a lease's return: at most the
-- window's return budget left (burst), and the grants outstanding
-- (ledger.go's takeReturn).
local function take_return(led, ret, burst)
  local budget = burst - led.rt
  if budget < ret then
    ret = budget
  end
  local took = give(led, 'l', ret)
  led.rt = led.rt + took
  return took
end

-- load reads the bucket at key and refills it to now: its tokens, its own
-- time (now, or later when the clock went backwards), and its ledger as of
-- now (ledger.go's at).
local function load(key, rate, burst)
  local led = {gen = gen, l0 = 0, l1 = 0, r0 = 0, r1 = 0, rt = 0}
  local v = redis.call('GET', key)
  if not v then
    return burst, now, led
  end
  local f = {}
  for w in string.gmatch(v, '%S+') do
    f[#f + 1] = tonumber(w)
  end
  local stored, stored_at = f[1], f[2]
  if (#f ~= 2 and #f ~= 8) or not stored or not stored_at
      or (#f == 8 and not (f[3] and f[4] and f[5] and f[6] and f[7] and f[8])) then
    return nil, redis.error_reply('limitd: malformed bucket value at ' .. key)
  end
  if #f == 8 then
    if gen <= f[3] then
      led = {gen = f[3], l0 = f[4], l1 = f[5], r0 = f[6], r1 = f[7], rt = f[8]}
    elseif gen == f[3] + 1 then
      led = {gen = gen, l0 = 0, l1 = f[4], r0 = 0, r1 = f[6], rt = 0}
    end
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
  return tok, at, led
end

-- store writes tok at time at, and the ledger led, into the bucket at key,
-- with the expiry described above (or, while the window's return budget is
-- in use, the end of the window if later), or deletes it when it is full at
-- once (a full bucket takes nothing back, so the rest of its ledger goes
-- with it).
local function store(key, tok, at, rate, burst, led)
  local fill = full_in(tok, rate, burst)
  -- A return budget in use must outlive the window, full or not (else a
  -- full bucket would forget it, and a caller could return every grant).
  local keep = 0
  if led.rt > 0 then
    keep = ((led.gen + 1) * window - now) * 1000
  end
  if fill == 0 and at == now and keep <= 0 then
    redis.call('DEL', key)
  else
    local ttl = math.ceil(math.max((at - now) * 1000 + fill, keep) / 1000000) + 1
    local v
    if led.l0 == 0 and led.l1 == 0 and led.r0 == 0 and led.r1 == 0 and led.rt == 0 then
      v = string.format('%.17g %.17g', tok, at)
    else
      v = string.format('%.17g %.17g %.17g %.17g %.17g %.17g %.17g %.17g', tok, at, led.gen, led.l0, led.l1, led.r0, led.r1, led.rt)
    end
    redis.call('SET', key, v, 'PX', ttl)
  end
end

