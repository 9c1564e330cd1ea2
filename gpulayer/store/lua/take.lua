-- Take the next message of a worker's queues and keep a copy in the worker's taking list, in one step.
-- KEYS[1..n] the queue keys in the order to try (kombu's priority keys included), KEYS[n+1] the taking list
-- Returns {queue key, message} or nil. The copy is "<queue key>\n<message>"; the caller drops it once
-- kombu's unacked entry and the delivery record exist (gpulayer/engine/transport.py).
local n = #KEYS - 1
for i = 1, n do
  local m = redis.call('RPOP', KEYS[i])
  if m then
    redis.call('LPUSH', KEYS[n + 1], KEYS[i] .. '\n' .. m)
    return {KEYS[i], m}
  end
end
return nil
