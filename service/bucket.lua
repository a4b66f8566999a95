-- bucket.lua: what decide.lua and lease.lua share, run before either (the
-- service prepends it): Redis's clock, and reading and writing one token
-- bucket.
--
-- Each key holds a string "<tokens> <at>": the tokens left (a float, printed
-- with 17 significant digits so it reads back bit for bit) at time <at> (Unix
-- microseconds). A missing key is a full bucket, like the zero bucket.State.
-- A bucket with a ledger (ledger.go: what leases granted and decisions
-- reserved, per caller, that the same caller's return or refund may give
-- back) holds "<tokens> <at> <gen> <returned> <reserved> <refunded>"
-- followed, for each caller with something outstanding, by "<caller>
-- <lease_cur> <lease_prev> <resv_cur> <resv_prev>": gen is the index of the
-- ledger window (Unix microseconds / window), returned what the current
-- window took back in returns (at most a burst), reserved what it reserved
-- and refunded what it took back in refunds (at most reserved plus a burst),
-- then each caller's two generations of each side. A caller's name has no spaces (CheckCaller). The record of an older
-- limitd, "<tokens> <at> <gen> <lease_cur> <lease_prev> <resv_cur>
-- <resv_prev> <returned>", names no caller: only its tokens and its return
-- budget are read. The window, in microseconds, is every script's last
-- ARGV; the caller is the one before it.
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
--
-- A quota (a bucket with a period: rate 0, and its period's start and end,
-- the 2n arguments after the n buckets' own, see period_of) never refills:
-- it is full again when its record was written before its period's start,
-- its ledger dropped (what an earlier period reserved is refunded to none),
-- and a record short of full lives to its period's end plus quota_margin,
-- an expiry a later write never shortens.

-- Redis before 5 replicates scripts verbatim and refuses writes after TIME
-- unless effects replication is on; from 7 on this is a no-op.
if redis.replicate_commands then
  redis.replicate_commands()
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local window = tonumber(ARGV[#ARGV])
local caller = ARGV[#ARGV - 1]
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

-- max_wait is the longest wait of a delayed decision, in nanoseconds
-- (bucket.MaxWait).
local max_wait = 60000000000

-- floor_of: the deepest debt a bucket may hold, one burst of charges plus
-- max_wait of delayed decisions (bucket's floor).
local function floor_of(rate, burst)
  return burst + rate * (max_wait / 1000000000)
end

-- quota_margin: how long, in microseconds, a quota's record outlives its
-- period's end (by Redis's clock), so that a gateway whose clock lags
-- Redis's still counts against it.
local quota_margin = 60000000

-- period_of: bucket i's period, its start and end in Unix microseconds (0,
-- 0: a token bucket), from ARGV[per*n + 2i - 1 .. per*n + 2i] (milliseconds),
-- after the per arguments of each of the n buckets.
local function period_of(i, per)
  local j = per * #KEYS + 2 * i
  return tonumber(ARGV[j - 1]) * 1000, tonumber(ARGV[j]) * 1000
end

-- in_period: a quota's tokens and time at now from its stored ones: full
-- (burst) when written before its period's start ps, and a time within the
-- newest period it was written in (at most pe - 1), so that a caller's
-- clock a little off Redis's neither resets a period twice nor carries a
-- record into the next one.
local function in_period(tok, stored_at, burst, ps, pe)
  if stored_at < ps then
    tok, stored_at = burst, ps
  end
  return tok, math.max(stored_at, math.min(math.max(now, ps), pe - 1))
end

-- A ledger is {gen, rt (returned), rs (reserved), rf (refunded), names (the
-- callers, in order), c (each caller's part {l0, l1, r0, r1}: leases and
-- reservations, current and previous)}.
local function new_ledger(g)
  return {gen = g, rt = 0, rs = 0, rf = 0, names = {}, c = {}}
end

-- put_caller adds name's part p to led unless p holds nothing.
local function put_caller(led, name, p)
  if p.l0 ~= 0 or p.l1 ~= 0 or p.r0 ~= 0 or p.r1 ~= 0 then
    if not led.c[name] then
      led.names[#led.names + 1] = name
    end
    led.c[name] = p
  end
end

-- part returns name's part of led, added (empty) when led has none
-- (ledger.go's of).
local function part(led, name)
  local p = led.c[name]
  if not p then
    p = {l0 = 0, l1 = 0, r0 = 0, r1 = 0}
    led.names[#led.names + 1] = name
    led.c[name] = p
  end
  return p
end

-- give takes up to x (>= 0) from one side of a caller's part p ('l'
-- leases, 'r' reservations), previous generation first, and returns what
-- it took (ledger.go's give).
local function give(p, side, x)
  if not (x > 0) then
    return 0
  end
  local took = 0
  for _, k in ipairs({side .. '1', side .. '0'}) do
    local d = math.min(x - took, p[k])
    if d > 0 then
      p[k] = p[k] - d
      took = took + d
    end
  end
  return took
end

-- take_return takes back up to ret (>= 0) of the caller's lease return: at
-- most the window's return budget left (burst), and the grants outstanding
-- to the caller (ledger.go's takeReturn).
local function take_return(led, ret, burst)
  local p = led.c[caller]
  if not p then
    return 0
  end
  local budget = burst - led.rt
  if budget < ret then
    ret = budget
  end
  local took = give(p, 'l', ret)
  led.rt = led.rt + took
  return took
end

-- take_refund takes back up to ref (>= 0) of the caller's refund: at most
-- the window's refund budget left (what it reserved, plus a burst, less what
-- it refunded), and the reservations outstanding to the caller (ledger.go's
-- takeRefund).
local function take_refund(led, ref, burst)
  local p = led.c[caller]
  if not p then
    return 0
  end
  local budget = burst + led.rs - led.rf
  if budget < ref then
    ref = budget
  end
  local took = give(p, 'r', ref)
  led.rf = led.rf + took
  return took
end

-- load reads the bucket at key and refills it to now: its tokens, its own
-- time (now, or later when the clock went backwards), and its ledger as of
-- now (ledger.go's at). A quota's (pe > 0) time is in_period's.
local function load(key, rate, burst, ps, pe)
  local led = new_ledger(gen)
  local v = redis.call('GET', key)
  if not v and pe > 0 then
    local tok, at = in_period(burst, ps, burst, ps, pe)
    return tok, at, led
  elseif not v then
    return burst, now, led
  end
  local w = {}
  for s in string.gmatch(v, '%S+') do
    w[#w + 1] = s
  end
  local n = #w
  local malformed = redis.error_reply('limitd: malformed bucket value at ' .. key)
  local stored, stored_at = tonumber(w[1]), tonumber(w[2])
  if not stored or not stored_at then
    return nil, malformed
  end
  if n == 8 then
    -- An older limitd's record: its ledger names no caller.
    local g, rt = tonumber(w[3]), tonumber(w[8])
    if not g or not rt or not tonumber(w[4]) or not tonumber(w[5]) or not tonumber(w[6]) or not tonumber(w[7]) then
      return nil, malformed
    end
    if gen <= g then
      led = new_ledger(g)
      led.rt = rt
    end
  elseif n >= 6 and (n - 6) % 5 == 0 then
    local g, rt, rs, rf = tonumber(w[3]), tonumber(w[4]), tonumber(w[5]), tonumber(w[6])
    if not g or not rt or not rs or not rf then
      return nil, malformed
    end
    if gen <= g then
      led = new_ledger(g)
      led.rt, led.rs, led.rf = rt, rs, rf
    end
    for j = 7, n, 5 do
      local l0, l1, r0, r1 = tonumber(w[j + 1]), tonumber(w[j + 2]), tonumber(w[j + 3]), tonumber(w[j + 4])
      if not l0 or not l1 or not r0 or not r1 then
        return nil, malformed
      end
      if gen <= g then
        put_caller(led, w[j], {l0 = l0, l1 = l1, r0 = r0, r1 = r1})
      elseif gen == g + 1 then
        put_caller(led, w[j], {l0 = 0, l1 = l0, r0 = 0, r1 = r0})
      end
    end
  elseif n ~= 2 then
    return nil, malformed
  end
  -- Negative tokens are a debt left by charge.lua (at most a burst) or by a
  -- delayed decision (decide.lua: at most rate × max_wait more); read no
  -- deeper than floor_of (bucket's level).
  local tok = stored
  local floor = floor_of(rate, burst)
  if tok ~= tok then
    tok = 0
  elseif tok < -floor then
    tok = -floor
  elseif tok > burst then
    tok = burst
  end
  local at = now
  if stored_at > now then
    at = stored_at
  end
  if pe > 0 then -- a quota never refills; a new period drops the ledger
    if stored_at < ps then
      led = new_ledger(gen)
    end
    tok, at = in_period(tok, stored_at, burst, ps, pe)
    return tok, at, led
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

-- store writes tok at time at, and the ledger led (callers with nothing
-- outstanding left out), into the bucket at key, with the expiry described
-- above (or, while the window's return or refund budget is in use, the end
-- of the window if later), or deletes it when it is full at once (a full
-- bucket takes nothing back, so the rest of its ledger goes with it). A
-- quota's (pe > 0) record short of full lives to pe plus quota_margin, or
-- longer if it already would.
local function store(key, tok, at, rate, burst, led, pe)
  local fill = full_in(tok, rate, burst)
  if pe > 0 and fill > 0 then
    fill = (pe + quota_margin - at) * 1000
  end
  -- A budget in use must outlive the window, full or not (else a full
  -- bucket would forget it, and a caller could give back every grant or
  -- reservation).
  local keep = 0
  if led.rt > 0 or led.rf > 0 then
    keep = ((led.gen + 1) * window - now) * 1000
  end
  if fill == 0 and at <= now and keep <= 0 then
    redis.call('DEL', key)
  else
    local ttl = math.ceil(math.max((at - now) * 1000 + fill, keep) / 1000000) + 1
    if pe > 0 then
      ttl = math.max(ttl, redis.call('PTTL', key), 1)
    end
    local parts = {}
    for _, name in ipairs(led.names) do
      local p = led.c[name]
      if p.l0 ~= 0 or p.l1 ~= 0 or p.r0 ~= 0 or p.r1 ~= 0 then
        parts[#parts + 1] = string.format(' %s %.17g %.17g %.17g %.17g', name, p.l0, p.l1, p.r0, p.r1)
      end
    end
    local v
    if #parts == 0 and led.rt == 0 and led.rs == 0 and led.rf == 0 then
      v = string.format('%.17g %.17g', tok, at)
    else
      v = string.format('%.17g %.17g %.17g %.17g %.17g %.17g', tok, at, led.gen, led.rt, led.rs, led.rf) .. table.concat(parts)
    end
    redis.call('SET', key, v, 'PX', ttl)
  end
end

