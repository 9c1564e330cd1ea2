-- Every worker heard from within ARGV[1] seconds, with its heartbeat time.
-- KEYS[1] workers zset, KEYS[2] workers info hash.
-- Returns {now, score1, info1, score2, info2, ...}; numbers as strings.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local live = redis.call('ZRANGEBYSCORE', KEYS[1], now - tonumber(ARGV[1]), '+inf', 'WITHSCORES')
local out = {tostring(now)}
for i = 1, #live, 2 do
  local info = redis.call('HGET', KEYS[2], live[i])
  if info then
    table.insert(out, live[i + 1])
    table.insert(out, info)
  end
end
return out
