-- many.lua: several calls of one script in one script run (batch.go). The
-- service builds the run from "local KEYS, ARGV = KEYS, ARGV", then the
-- script's shared part (bucket.lua, for decide.lua; none for window.lua),
-- then the script's own part as "local function one() ... end", then a
-- "local function prepare() ... end" that sets what the shared part read
-- from a call's arguments (decide.lua: the caller, the ledger window and
-- its generation), then this.
--
-- ARGV[1]              n, the calls
-- ARGV[2i], ARGV[2i+1] the number of keys and of arguments of call i
-- then                 call 1's arguments, call 2's, ...
-- KEYS                 call 1's keys, call 2's, ...
--
-- Each call runs as it would alone, in order, each after the writes of the
-- ones before it: the same as n runs one after the other at one instant
-- (Redis's TIME is read once). A call that fails (an error reply, or an
-- error raised by a command) answers its error as a string and the others
-- still run; its writes are those it made before the error, as alone.
--
-- Returns {reply_1, ..., reply_n}: each call's own reply (a table), or its
-- error (a string).

local all_keys, all_args = KEYS, ARGV
local calls = tonumber(all_args[1])
local ki, ai = 0, 1 + 2 * calls
local replies = {}
for c = 1, calls do
  local nk, na = tonumber(all_args[2 * c]), tonumber(all_args[2 * c + 1])
  local k, a = {}, {}
  for i = 1, nk do
    k[i] = all_keys[ki + i]
  end
  for i = 1, na do
    a[i] = all_args[ai + i]
  end
  ki, ai = ki + nk, ai + na
  KEYS, ARGV = k, a
  prepare()
  local ok, res = pcall(one)
  if type(res) == 'table' and res.err then
    res = res.err
  elseif not ok then
    res = tostring(res)
  end
  replies[c] = res
end
return replies
