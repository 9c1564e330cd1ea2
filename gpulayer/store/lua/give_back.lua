-- Put messages a worker took but never started back at the consuming end of their queues, as they were taken
-- (not marked redelivered: no process ever saw them), each only while kombu's unacked entry is still there.
-- KEYS[1] kombu's unacked hash, KEYS[2] kombu's unacked index, KEYS[3] the life's delivery records, then one queue
-- key per message; ARGV: delivery tag, message, ... in the order they were taken (the first taken ends up first).
-- Returns how many went back (one handed back already, by the janitor or a reconnect, is skipped).
local back = 0
for i = #ARGV - 1, 1, -2 do
  local tag = ARGV[i]
  if redis.call('HDEL', KEYS[1], tag) == 1 then
    redis.call('ZREM', KEYS[2], tag)
    redis.call('HDEL', KEYS[3], tag)
    redis.call('RPUSH', KEYS[3 + (i + 1) / 2], ARGV[i + 1])
    back = back + 1
  end
end
return back
