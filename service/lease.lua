-- lease.lua: one atomic lease call over one or more token buckets (after
-- bucket.lua, which it uses): package bucket's Limit.Lease on each.
--
-- KEYS[i]            the Redis key of bucket i (all in one Redis Cluster slot)
-- ARGV[5i-4 .. 5i]   rate, burst, want, min, return of bucket i
-- ARGV[5n+2i-1 ..]  period start and end of bucket i (as in decide.lua)
-- ARGV[7n+1]         the caller's name
-- ARGV[7n+2]         the ledger window, microseconds
--
-- Every bucket first takes back its return, clamped to what its ledger says
-- leases granted to the caller and were not yet returned, and to the
-- window's return budget (a burst per window), and to its burst; a quota
-- takes back nothing when its record is of a later period than the call's
-- (a return of an ended period never credits the next one). Then, if
-- every bucket holds its min, each grants min(want, tokens) (never less
-- than min), is debited that much and records the grant as the caller's in
-- its ledger;
-- otherwise nothing is granted, and only the buckets that took a return are
-- written (as package bucket's Lease).
--
-- Returns {all, granted_1, tokens_1, gap_1, returned_1, ...}: all is 1 when
-- every bucket granted; granted_i, tokens_i and returned_i (strings) are what
-- bucket i granted, holds after the call and took back of its return; gap_i
-- as in decide.lua.

local n = #KEYS
local p, tokens, ats, leds, returned = {}, {}, {}, {}, {}
local all = 1
for i = 1, n do
  local rate = tonumber(ARGV[5 * i - 4])
  local burst = tonumber(ARGV[5 * i - 3])
  local want = tonumber(ARGV[5 * i - 2])
  local lo = tonumber(ARGV[5 * i - 1])
  local ret = tonumber(ARGV[5 * i])
  local ps, pe = period_of(i, 5)
  local tok, at, led = load(KEYS[i], rate, burst, ps, pe)
  if not tok then
    return at
  end
  -- A quota's record written in a later period than the call's (at past
  -- pe: in_period keeps a record of the call's period below pe) takes no
  -- return: what a lease of an ended period held is not the later
  -- period's to credit, and this caller's grants in the ledger are.
  if pe > 0 and at >= pe then
    ret = 0
  end
  ret = take_return(led, ret, burst)
  -- What the return adds: all of it, or what a full bucket leaves room
  -- for; said as the amount itself (a difference of two token counts
  -- would carry their rounding).
  local took = 0
  if ret > 0 and tok < burst then
    if tok + ret > burst then
      took, tok = burst - tok, burst
    else
      took, tok = ret, tok + ret
    end
  end
  p[i] = {rate = rate, burst = burst, want = want, lo = lo, ret = ret, pe = pe}
  tokens[i], ats[i], leds[i], returned[i] = tok, at, led, took
  if not (lo <= want and want <= burst and tok + slack(rate, burst) >= lo) then
    all = 0
  end
end

local granted = {}
for i = 1, n do
  local g = 0
  if all == 1 then
    g = tokens[i]
    if g > p[i].want then
      g = p[i].want
    end
    if g < p[i].lo then
      g = p[i].lo
    end
    local tok = tokens[i] - g
    local floor = 0 -- a debt stays (bucket's Lease)
    if tokens[i] < 0 then
      floor = tokens[i]
    end
    if tok < floor then
      tok = floor
    end
    tokens[i] = tok
    local lp = part(leds[i], caller)
    lp.l0 = lp.l0 + g
  end
  granted[i] = g
  if all == 1 or p[i].ret > 0 then
    store(KEYS[i], tokens[i], ats[i], p[i].rate, p[i].burst, leds[i], p[i].pe)
  end
end

local out = {all}
for i = 1, n do
  out[#out + 1] = string.format('%.17g', granted[i])
  out[#out + 1] = string.format('%.17g', tokens[i])
  out[#out + 1] = (ats[i] - now) * 1000
  out[#out + 1] = string.format('%.17g', returned[i])
end
return out
