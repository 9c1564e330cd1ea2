-- Record a new object with its first holder, and count it in the stats: all at once, so an object is never
-- counted without a record nor recorded without a holder.
-- KEYS[1] gl:obj:<oid>, KEYS[2] its holders, KEYS[3] gl:objs, KEYS[4] gl:objs:stats
-- ARGV: oid, size, store URL, created (unix time), holder, the holder's expiry (unix time)
-- Returns 1, or 0 when the oid has a record already (nothing changed).
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'size', ARGV[2], 'store', ARGV[3], 'created', ARGV[4], 'state', 'live', 'fetches', 0)
redis.call('ZADD', KEYS[2], ARGV[6], ARGV[5])
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('HINCRBY', KEYS[4], 'count', 1)
redis.call('HINCRBY', KEYS[4], 'bytes', ARGV[2])
return 1
