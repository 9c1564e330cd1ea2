-- Give back one worker's slots for one gang attempt, exactly once.
-- KEYS[1] slots-held hash, KEYS[2] the attempt's released hash; ARGV[1] worker id, ARGV[2] slots
if redis.call('HSETNX', KEYS[2], ARGV[1], 1) == 0 then return 0 end
redis.call('EXPIRE', KEYS[2], 86400)
local left = redis.call('HINCRBY', KEYS[1], ARGV[1], -tonumber(ARGV[2]))
if left <= 0 then redis.call('HDEL', KEYS[1], ARGV[1]) end
return 1
