-- window.lua: fixed-window counters, counted the way envoyproxy/ratelimit
-- counts them (the rate limit service's fixed_window algorithm).
--
-- KEYS[i]        counter i, named with its window's start (all in one Redis
--                Cluster slot)
-- ARGV[2i-1]     the hits to add to counter i (0 reads it)
-- ARGV[2i]       the counter's expiry, seconds (the window's length)
--
-- Every counter is incremented by its hits and given its expiry, whatever
-- the others hold: a fixed window counts the hits over its limit too, and
-- one counter over its limit does not keep the others from counting.
--
-- Returns {count_1, ..., count_n}: each counter after its increment.

local out = {}
for i = 1, #KEYS do
  local n = redis.call('INCRBY', KEYS[i], ARGV[2 * i - 1])
  redis.call('EXPIRE', KEYS[i], ARGV[2 * i])
  out[i] = n
end
return out
