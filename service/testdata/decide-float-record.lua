-- The decision script of a limitd from before the integer record (bucket.lua
-- and decide.lua as they were): what an older limitd runs on a new record
-- (record_test.go).
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
-- now (ledger.go's at).
local function load(key, rate, burst)
  local led = new_ledger(gen)
  local v = redis.call('GET', key)
  if not v then
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
-- bucket takes nothing back, so the rest of its ledger goes with it).
local function store(key, tok, at, rate, burst, led)
  local fill = full_in(tok, rate, burst)
  -- A budget in use must outlive the window, full or not (else a full
  -- bucket would forget it, and a caller could give back every grant or
  -- reservation).
  local keep = 0
  if led.rt > 0 or led.rf > 0 then
    keep = ((led.gen + 1) * window - now) * 1000
  end
  if fill == 0 and at == now and keep <= 0 then
    redis.call('DEL', key)
  else
    local ttl = math.ceil(math.max((at - now) * 1000 + fill, keep) / 1000000) + 1
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

-- decide.lua: one atomic decision over one or more token buckets (after
-- bucket.lua, which it uses).
--
-- KEYS[i]            the Redis key of bucket i (all in one Redis Cluster slot)
-- ARGV[5i-4 .. 5i]   rate (tokens per second), burst, cost, refundable (1
--                    or 0), max delay (milliseconds, 0: refuse) of bucket i
-- ARGV[5n+1]         the caller's name
-- ARGV[5n+2]         the ledger window, microseconds
--
-- A bucket admits its cost when it holds it (package bucket's Take); one
-- short of it whose max delay is above 0 admits it too when the wait until
-- its tokens would have been there is at most that delay (at most max_wait):
-- it takes them now, into debt (bucket's Reserve). Either every bucket
-- admits its cost and all are consumed, each refundable one recording its
-- cost as the caller's reservation in its ledger (a later charge of the same
-- caller may refund it, a delayed one too), or nothing is written.
--
-- Returns {all, ok_1, tokens_1, gap_1, wait_1, ..., ok_n, tokens_n, gap_n,
-- wait_n}: all is 1 when the request was admitted; ok_i is 1 when bucket i
-- alone had enough tokens, or could wait for them within its bound; tokens_i
-- (a string) is what bucket i holds after the decision (after consumption
-- when admitted, refilled but untouched otherwise); gap_i is the nanoseconds
-- by which the bucket's time is ahead of TIME (non-zero only when the clock
-- went backwards); wait_i is the nanoseconds bucket i's request must wait for
-- its tokens (0 when it had them; the gap included).

local n = #KEYS
local rates, bursts, costs, refundable, tokens, ats, leds, waits = {}, {}, {}, {}, {}, {}, {}, {}
local all = 1
local ok = {}
for i = 1, n do
  local rate = tonumber(ARGV[5 * i - 4])
  local burst = tonumber(ARGV[5 * i - 3])
  local cost = tonumber(ARGV[5 * i - 2])
  refundable[i] = ARGV[5 * i - 1] == '1'
  local delay = tonumber(ARGV[5 * i]) * 1000000
  if delay > max_wait then
    delay = max_wait
  end
  if cost < 0 then
    cost = 0
  end
  local tok, at, led = load(KEYS[i], rate, burst)
  if not tok then
    return at
  end
  rates[i], bursts[i], costs[i], tokens[i], ats[i], leds[i], waits[i] = rate, burst, cost, tok, at, led, 0
  ok[i] = 0
  if cost <= burst and tok + slack(rate, burst) >= cost then
    ok[i] = 1
  elseif cost <= burst and delay > 0 then
    -- Short: the wait until the debt this take leaves is paid back,
    -- counted from TIME (bucket's Reserve).
    local w = refill_in(-(tok - cost), rate) + (at - now) * 1000
    if w <= delay then
      ok[i], waits[i] = 1, w
    end
  end
  if ok[i] == 0 then
    all = 0
  end
end

if all == 1 then
  for i = 1, n do
    local tok = tokens[i] - costs[i]
    if waits[i] == 0 then -- taken from what it held (a wait is at least 1 ns)
      if tok < 0 then
        tok = 0
      end
    else
      local floor = floor_of(rates[i], bursts[i])
      if tok < -floor then
        tok = -floor
      end
    end
    tokens[i] = tok
    if refundable[i] then
      local p = part(leds[i], caller)
      p.r0 = p.r0 + costs[i]
      leds[i].rs = leds[i].rs + costs[i]
    end
    store(KEYS[i], tok, ats[i], rates[i], bursts[i], leds[i])
  end
end

local out = {all}
for i = 1, n do
  out[#out + 1] = ok[i]
  out[#out + 1] = string.format('%.17g', tokens[i])
  out[#out + 1] = (ats[i] - now) * 1000
  out[#out + 1] = waits[i]
end
return out
