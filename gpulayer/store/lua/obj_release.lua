-- Drop holders of objects and prune their expired ones; an object left with none is marked deleting (nothing
-- can hold it again, obj_hold.lua) and returned, for the caller to delete its bytes and then obj_forget.lua.
-- KEYS: gl:obj:<oid>, its holders, ... (a pair per object); ARGV[1] now (unix time), then oid, holder per pair
-- (holder "" drops none: a sweep's pruning). A record gone, or deleting already, is left as it is.
-- Returns oid, store URL, ... of the objects this call marked deleting.
local now, out = tonumber(ARGV[1]), {}
for i = 1, #KEYS, 2 do
  local oid, holder = ARGV[i + 1], ARGV[i + 2]
  if holder ~= '' then
    redis.call('ZREM', KEYS[i + 1], holder)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[i + 1], '-inf', '(' .. now)
  if redis.call('ZCARD', KEYS[i + 1]) == 0 and redis.call('HGET', KEYS[i], 'state') == 'live' then
    redis.call('HSET', KEYS[i], 'state', 'deleting', 'deleting_at', ARGV[1])
    out[#out + 1] = oid
    out[#out + 1] = redis.call('HGET', KEYS[i], 'store')
  end
end
return out
