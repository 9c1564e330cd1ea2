-- Reserve a gang's slots on every chosen worker at once, or on none.
-- KEYS[1] slots-held hash, KEYS[2] workers info hash, KEYS[3] gang hash
-- ARGV[1] procs per node, ARGV[2] attempt, ARGV[3..] worker ids
-- Returns {1} on success, {0, worker id, free} when that worker no longer has room,
-- {2} when this attempt is already reserved (a second coordinator for the same attempt).
if redis.call('HGET', KEYS[3], 'reserved_attempt') == ARGV[2] then return {2} end
local m = tonumber(ARGV[1])
for i = 3, #ARGV do
  local info = redis.call('HGET', KEYS[2], ARGV[i])
  if not info then return {0, ARGV[i], -1} end
  local w = cjson.decode(info)
  local held = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  local free = w['slots'] - w['busy'] - held
  if free < m then return {0, ARGV[i], free} end
end
for i = 3, #ARGV do
  redis.call('HINCRBY', KEYS[1], ARGV[i], m)
end
redis.call('HSET', KEYS[3], 'reserved_attempt', ARGV[2])
return {1}
