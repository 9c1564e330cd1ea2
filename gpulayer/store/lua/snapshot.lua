-- Every worker heard from within ARGV[1] seconds, as one JSON array of WorkerInfo records
-- (busy, held and heartbeat age filled in), with the registry version it reflects.
-- KEYS[1] workers zset, KEYS[2] info hash, KEYS[3] static hash, KEYS[4] load hash, KEYS[5] version
-- Returns {now, version, json}.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local version = redis.call('GET', KEYS[5]) or '0'
local live = redis.call('ZRANGEBYSCORE', KEYS[1], now - tonumber(ARGV[1]), '+inf', 'WITHSCORES')
local out = {}
for i = 1, #live, 2 do
  local id = live[i]
  local static = redis.call('HGET', KEYS[3], id)
  if static then
    local busy, held = string.match(redis.call('HGET', KEYS[4], id) or '0 0', '^(%S+) (%S+)$')
    local age = math.max(0, now - tonumber(live[i + 1]))
    out[#out + 1] = string.sub(static, 1, -2) .. ',"busy":' .. busy .. ',"held":' .. held
                    .. ',"heartbeat_age":' .. string.format('%.6f', age) .. '}'
  else
    -- a worker of an older gpulayer writes only its full record; its heartbeat age reads 0
    local info = redis.call('HGET', KEYS[2], id)
    if info then out[#out + 1] = info end
  end
end
return {tostring(now), version, '[' .. table.concat(out, ',') .. ']'}
