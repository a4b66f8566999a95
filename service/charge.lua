-- charge.lua: one charge call over one or more token buckets (after
-- bucket.lua, which it uses): package bucket's Limit.Charge on each, for a
-- cost known only from the response.
--
-- KEYS[i]            the Redis key of bucket i (all keys share one hash tag)
-- ARGV[3i-2 .. 3i]   rate, burst, amount of bucket i
--
-- A positive amount takes more tokens, into debt down to -burst at most; a
-- negative one gives tokens back, never above burst, and changes nothing on
-- a missing key (a full bucket). A charge cannot be refused.
--
-- Returns {tokens_1, gap_1, ..., tokens_n, gap_n}: tokens_i (a string) is
-- what bucket i holds after its charge; gap_i as in decide.lua.

local out = {}
for i = 1, #KEYS do
  local rate = tonumber(ARGV[3 * i - 2])
  local burst = tonumber(ARGV[3 * i - 1])
  local amount = tonumber(ARGV[3 * i])
  local missing = redis.call('EXISTS', KEYS[i]) == 0
  local tok, at = load(KEYS[i], rate, burst)
  if not tok then
    return at
  end
  if (amount > 0) or (amount < 0 and not missing) then
    tok = tok - amount
    if tok < -burst then
      tok = -burst
    elseif tok > burst then
      tok = burst
    end
    store(KEYS[i], tok, at, rate, burst)
  end
  out[#out + 1] = string.format('%.17g', tok)
  out[#out + 1] = (at - now) * 1000
end
return out
