-- Record heartbeats of one or more workers with Redis's own clock, so machines with skewed
-- clocks still agree on who is alive. Bumps the registry's version only for what a snapshot
-- reader must see again: a new or changed record (or a worker back from the dead), or new
-- busy/held counts. An unchanged heartbeat writes only its time.
-- KEYS[1] workers zset, KEYS[2] info hash, KEYS[3] static hash, KEYS[4] load hash,
-- KEYS[5] version, KEYS[6] changed zset, KEYS[7] load-changed zset, KEYS[8] packed hash,
-- KEYS[9] packed-synced version
-- ARGV[1] dead_after seconds; then 5 per worker: id, static JSON (an object), the static fields
-- packed ('' when they cannot be), busy, held
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local cutoff = now - tonumber(ARGV[1])
-- The packed records stay in sync only while every change goes through this script: a writer of
-- an older gpulayer bumps the version alone, and readers then fall back to the JSON records.
local synced = (redis.call('GET', KEYS[9]) or '0') == (redis.call('GET', KEYS[5]) or '0')
local bumped = false
for i = 2, #ARGV, 5 do
  local id, static, packed, busy, held = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  local load = busy .. ' ' .. held
  local prev = redis.call('ZSCORE', KEYS[1], id)
  redis.call('ZADD', KEYS[1], now, id)
  local static_changed = (not prev) or tonumber(prev) < cutoff or redis.call('HGET', KEYS[3], id) ~= static
  local load_changed = redis.call('HGET', KEYS[4], id) ~= load
  if static_changed then
    redis.call('HSET', KEYS[3], id, static)
    redis.call('ZADD', KEYS[6], redis.call('INCR', KEYS[5]), id)
  end
  if load_changed then
    redis.call('HSET', KEYS[4], id, load)
    redis.call('ZADD', KEYS[7], redis.call('INCR', KEYS[5]), id)
  end
  if static_changed or load_changed then
    bumped = true
    redis.call('HSET', KEYS[2], id, string.sub(static, 1, -2) .. ',"busy":' .. busy .. ',"held":' .. held .. '}')
    if packed ~= '' then
      redis.call('HSET', KEYS[8], id, packed .. '\31' .. busy .. '\31' .. held)
    else
      redis.call('HDEL', KEYS[8], id)
    end
  end
end
if synced and bumped then
  redis.call('SET', KEYS[9], redis.call('GET', KEYS[5]))
end
return tostring(now)
