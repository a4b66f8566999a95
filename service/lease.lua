-- lease.lua: one atomic lease call over one or more token buckets (after
-- bucket.lua, which it uses): package bucket's Limit.Lease on each.
--
-- KEYS[i]            the Redis key of bucket i (all keys share one hash tag)
-- ARGV[5i-4 .. 5i]   rate, burst, want, min, return of bucket i
--
-- Every bucket first takes back its return (clamped to its burst). Then, if
-- every bucket holds its min, each grants min(want, tokens) (never less
-- than min) and is debited that much; otherwise nothing is granted, and only
-- the buckets that took a return are written (as package bucket's Lease).
--
-- Returns {all, granted_1, tokens_1, gap_1, ..., granted_n, tokens_n, gap_n}:
-- all is 1 when every bucket granted; granted_i and tokens_i (strings) are
-- what bucket i granted and holds after the call; gap_i as in decide.lua.

local n = #KEYS
local p, tokens, ats = {}, {}, {}
local all = 1
for i = 1, n do
  local rate = tonumber(ARGV[5 * i - 4])
  local burst = tonumber(ARGV[5 * i - 3])
  local want = tonumber(ARGV[5 * i - 2])
  local lo = tonumber(ARGV[5 * i - 1])
  local ret = tonumber(ARGV[5 * i])
  local tok, at = load(KEYS[i], rate, burst)
  if not tok then
    return at
  end
  if ret > 0 and tok < burst then
    tok = tok + ret
    if tok > burst then
      tok = burst
    end
  end
  p[i] = {rate = rate, burst = burst, want = want, lo = lo, ret = ret}
  tokens[i], ats[i] = tok, at
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
  end
  granted[i] = g
  if all == 1 or p[i].ret > 0 then
    store(KEYS[i], tokens[i], ats[i], p[i].rate, p[i].burst)
  end
end

local out = {all}
for i = 1, n do
  out[#out + 1] = string.format('%.17g', granted[i])
  out[#out + 1] = string.format('%.17g', tokens[i])
  out[#out + 1] = (ats[i] - now) * 1000
end
return out
