-- decide.lua: one atomic decision over one or more token buckets (after
-- bucket.lua, which it uses).
--
-- KEYS[i]            the Redis key of bucket i (all in one Redis Cluster slot)
-- ARGV[4i-3 .. 4i]   rate (tokens per second), burst, cost, refundable (1
--                    or 0) of bucket i
-- ARGV[4n+1]         the caller's name
-- ARGV[4n+2]         the ledger window, microseconds
--
-- Either every bucket admits its cost and all are consumed, each refundable
-- one recording its cost as the caller's reservation in its ledger (a later
-- charge of the same caller may refund it), or nothing is written.
--
-- Returns {all, ok_1, tokens_1, gap_1, ..., ok_n, tokens_n, gap_n}: all is 1
-- when the request was admitted; ok_i is 1 when bucket i alone had enough
-- tokens; tokens_i (a string) is what bucket i holds after the decision
-- (after consumption when admitted, refilled but untouched otherwise); gap_i
-- is the nanoseconds by which the bucket's time is ahead of TIME (non-zero only
-- when the clock went backwards).

local n = #KEYS
local rates, bursts, costs, refundable, tokens, ats, leds = {}, {}, {}, {}, {}, {}, {}
local all = 1
local ok = {}
for i = 1, n do
  local rate = tonumber(ARGV[4 * i - 3])
  local burst = tonumber(ARGV[4 * i - 2])
  local cost = tonumber(ARGV[4 * i - 1])
  refundable[i] = ARGV[4 * i] == '1'
  if cost < 0 then
    cost = 0
  end
  local tok, at, led = load(KEYS[i], rate, burst)
  if not tok then
    return at
  end
  rates[i], bursts[i], costs[i], tokens[i], ats[i], leds[i] = rate, burst, cost, tok, at, led
  if cost <= burst and tok + slack(rate, burst) >= cost then
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
end
return out
