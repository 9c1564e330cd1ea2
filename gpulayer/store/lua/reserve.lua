-- Reserve a gang's slots on every chosen worker at once, or on none; on success the gang is running.
-- KEYS[1] slots-held hash, KEYS[2] workers info hash, KEYS[3] gang hash, KEYS[4] waiting gangs zset
-- ARGV[1] procs per node, ARGV[2] attempt, ARGV[3] placement JSON, ARGV[4] reason, ARGV[5] gang id,
-- ARGV[6..] worker ids
-- Returns {1} on success, {0, worker id, free} when that worker no longer has room,
-- {2} when this attempt is already reserved (a second coordinator for the same attempt),
-- {3} when the gang no longer waits (cancelled, or ended by its timeout).
-- A gang hash without a state (benchmarks/fleet_scale.py's bare reservations) only records the attempt.
local state = redis.call('HGET', KEYS[3], 'state')
if redis.call('HGET', KEYS[3], 'reserved_attempt') == ARGV[2] then return {2} end
if state and state ~= 'waiting' then return {3} end
local m = tonumber(ARGV[1])
for i = 6, #ARGV do
  local info = redis.call('HGET', KEYS[2], ARGV[i])
  if not info then return {0, ARGV[i], -1} end
  local w = cjson.decode(info)
  local held = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  local free = w['slots'] - w['busy'] - held
  if free < m then return {0, ARGV[i], free} end
end
for i = 6, #ARGV do
  redis.call('HINCRBY', KEYS[1], ARGV[i], m)
end
redis.call('HSET', KEYS[3], 'reserved_attempt', ARGV[2])
if state then
  redis.call('HSET', KEYS[3], 'state', 'running', 'reason', ARGV[4], 'placement', ARGV[3], 'attempt', ARGV[2])
  redis.call('ZREM', KEYS[4], ARGV[5])
end
return {1}
