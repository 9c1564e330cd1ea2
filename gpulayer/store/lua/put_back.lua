-- Put a taken message back at the consuming end of its queue, if its taking copy is still there.
-- KEYS[1] the taking list, KEYS[2] the queue key; ARGV[1] the copy ("<queue key>\n<message>"), ARGV[2] the message
-- Returns 1 if put back, 0 if the copy was gone (recorded after all, or handed back by the janitor).
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  redis.call('RPUSH', KEYS[2], ARGV[2])
  return 1
end
return 0
