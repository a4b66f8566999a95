-- charge.lua: one charge call over one or more token buckets (after
-- bucket.lua, which it uses): package bucket's Limit.Charge on each, for a
-- cost known only from the response.
--
-- KEYS[i]            the Redis key of bucket i (all in one Redis Cluster slot)
-- ARGV[3i-2 .. 3i]   rate, burst, amount of bucket i
-- ARGV[3n+2i-1 ..]  period start and end of bucket i (as in decide.lua)
-- ARGV[5n+1]         the mode: "refund" (a caller's charge) or "undo" (the
--                    store giving back a take it just made)
-- ARGV[5n+2]         the caller's name
-- ARGV[5n+3]         the ledger window, microseconds
--
-- A positive amount takes more tokens: clamped to 2 × burst (what can take a
-- full bucket to its deepest debt), into debt down to -burst at most (a
-- deeper debt, left by delayed decisions, it leaves where it is). A
-- negative one is a refund: clamped to what the bucket's ledger says the
-- caller's decisions reserved and were not yet refunded, and to the window's
-- refund budget (what the window reserved, plus a burst, less what it
-- refunded), and given back never above burst; a
-- missing key (a full bucket, no ledger) changes nothing. In mode "undo" a
-- negative amount is given back whole (the caller's reservation of it, if
-- any, dropped, no budget spent): RedisStore.Decide gives back so, across
-- Redis Cluster slots, what a decision refused in another slot just took; no
-- call of a client reaches it. A charge cannot be refused.
--
-- Returns {tokens_1, gap_1, applied_1, ...}: tokens_i (a string) is what
-- bucket i holds after its charge; gap_i as in decide.lua; applied_i (a
-- string) what the charge took from the bucket (negative for a refund).

local undo = ARGV[#ARGV - 2] == 'undo'
local out = {}
for i = 1, #KEYS do
  local rate = tonumber(ARGV[3 * i - 2])
  local burst = tonumber(ARGV[3 * i - 1])
  local amount = tonumber(ARGV[3 * i])
  local ps, pe = period_of(i, 3)
  local tok, at, led = load(KEYS[i], rate, burst, ps, pe)
  if not tok then
    return at
  end
  if amount > 2 * burst then
    amount = 2 * burst
  elseif amount < 0 and undo then
    local p = led.c[caller]
    if p then
      give(p, 'r', -amount)
    end
  elseif amount < 0 then
    amount = -take_refund(led, -amount, burst)
  end
  -- What the charge took: the amount, or what the bounds of the bucket
  -- leave (said as the amount itself: a difference of two token counts
  -- would carry their rounding).
  local applied = 0
  if amount ~= 0 then
    if amount > 0 and tok - amount < -burst then
      if tok >= -burst then
        applied, tok = tok + burst, -burst
      end -- else a delayed decision's deeper debt stays where it is
    elseif tok - amount > burst then
      applied, tok = tok - burst, burst
    else
      applied, tok = amount, tok - amount
    end
    store(KEYS[i], tok, at, rate, burst, led, pe)
  end
  out[#out + 1] = string.format('%.17g', tok)
  out[#out + 1] = (at - now) * 1000
  out[#out + 1] = string.format('%.17g', applied)
end
return out
