-- take_floor.lua: the benchmark's floor for a plain decision (the
-- benchfloor build only; see take_floor.go). The Redis work every token
-- bucket kept by a script does, and nothing else: read the record, read
-- the clock, write a record as long as take.lua's. It admits every plain
-- decision; anything else falls through to the general part.
if #KEYS == 1 and ARGV[4] == '0' and ARGV[5] == '0' and ARGV[6] == '0' and ARGV[7] == '0' then
  redis.call('GET', KEYS[1])
  if redis.replicate_commands then
    redis.replicate_commands()
  end
  redis.call('TIME')
  redis.call('SET', KEYS[1], '999999999 1764523145123456', 'PX', 2000)
  return {1, 1, '999999999', 0, 0}
end
