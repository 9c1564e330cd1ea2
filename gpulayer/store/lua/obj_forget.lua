-- Drop the record of an object whose bytes were deleted, and take it out of the stats.
-- KEYS[1] gl:obj:<oid>, KEYS[2] its holders, KEYS[3] gl:objs, KEYS[4] gl:objs:stats; ARGV[1] oid
-- Only an object marked deleting (obj_release.lua) is forgotten: returns 1, else 0 (already forgotten).
if redis.call('HGET', KEYS[1], 'state') ~= 'deleting' then
  return 0
end
local size = tonumber(redis.call('HGET', KEYS[1], 'size')) or 0
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('SREM', KEYS[3], ARGV[1])
redis.call('HINCRBY', KEYS[4], 'count', -1)
redis.call('HINCRBY', KEYS[4], 'bytes', -size)
return 1
