-- Record one worker's heartbeat with Redis's own clock, so machines with skewed
-- clocks still agree on who is alive.
-- KEYS[1] workers zset, KEYS[2] workers info hash; ARGV[1] worker id, ARGV[2] info JSON
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return tostring(now)
