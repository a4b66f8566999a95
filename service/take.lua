-- take.lua: decide.lua's plain decision, run first (the service puts it
-- before bucket.lua and decide.lua): one token bucket, no refund, no delay,
-- no period, whose record is missing or holds only "<tokens> <at>". It
-- answers such a decision itself, exactly as bucket.lua and decide.lua would
-- (the same operations in the same order, so the same reply, record and
-- expiry, bit for bit), and declines anything else by doing nothing, so the
-- general part below it runs. It exists for cost: it skips the general
-- part's helpers (a closure each, made on every call), ledger and tables
-- (the saving: docs/benchmarks). Keep it in step with load, store and
-- decide.lua; TestTakeMatchesDecide holds it to them.
if #KEYS == 1 and ARGV[4] == '0' and ARGV[5] == '0' and ARGV[6] == '0' and ARGV[7] == '0' then
  local key = KEYS[1]
  local v = redis.call('GET', key)
  local stored, stored_at
  if v then
    local a, b = string.match(v, '^(%S+) (%S+)$')
    stored, stored_at = tonumber(a), tonumber(b)
  end
  if not v or (stored and stored_at) then
    if redis.replicate_commands then
      redis.replicate_commands()
    end
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
    if cost < 0 then
      cost = 0
    end
    -- full_in: bucket.lua's, for this bucket's rate and burst.
    local function full_in(tok)
      local x = burst - tok - 1e-12 * burst
      if not (x > 0) then
        return 0
      end
      return math.ceil(x / rate * 1000000000)
    end
    local tok, at = burst, now
    if v then -- load
      tok = stored
      local floor = burst + rate * 60 -- floor_of: max_wait is 60 s
      if tok ~= tok then
        tok = 0
      elseif tok < -floor then
        tok = -floor
      elseif tok > burst then
        tok = burst
      end
      if stored_at > now then
        at = stored_at
      end
      local elapsed = (now - stored_at) * 1000
      if elapsed > 0 then
        local refilled = tok + rate * elapsed / 1000000000
        if refilled < burst * 0.999999999998 then
          tok = refilled
        elseif elapsed >= full_in(tok) then
          tok = burst
        elseif refilled < burst then
          tok = refilled
        else
          tok = burst
        end
      end
    end
    local ok, ts = 0, nil
    if cost <= burst and tok + (rate * 1e-9 + 1e-12 * burst) >= cost then -- slack
      ok = 1
      tok = tok - cost
      if tok < 0 then
        tok = 0
      end
      local fill = full_in(tok) -- store, with no ledger
      ts = string.format('%.17g', tok)
      if fill == 0 and at <= now then
        redis.call('DEL', key)
      else
        local ttl = math.ceil(math.max((at - now) * 1000 + fill, 0) / 1000000) + 1
        redis.call('SET', key, ts .. ' ' .. string.format('%.17g', at), 'PX', ttl)
      end
    end
    return {ok, ok, ts or string.format('%.17g', tok), (at - now) * 1000, 0}
  end
end

