-- decide.lua: one atomic decision over one or more token buckets (after
-- bucket.lua, which it uses).
--
-- KEYS[i]            the Redis key of bucket i (all in one Redis Cluster slot)
-- ARGV[5i-4 .. 5i]   rate (tokens per second), burst, cost, refundable (1
--                    or 0), max delay (milliseconds, 0: refuse) of bucket i
-- ARGV[5n+2i-1 ..]  period start and end of bucket i (Unix milliseconds;
--                    0 0: a token bucket, else a quota: bucket.lua)
-- ARGV[7n+1]         the caller's name
-- ARGV[7n+2]         the ledger window, microseconds
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
local ends = {}
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
  local ps, pe = period_of(i, 5)
  ends[i] = pe
  local tok, at, led = load(KEYS[i], rate, burst, ps, pe)
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
    store(KEYS[i], tok, ats[i], rates[i], bursts[i], leds[i], ends[i])
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
