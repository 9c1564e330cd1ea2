-- What changed in the registry after version ARGV[2]: the records of workers whose record
-- changed, the busy/held counts of workers whose load changed, the workers not heard from
-- within ARGV[1] seconds, and how many are live. Costs what changed, not the fleet.
-- KEYS[1] workers zset, KEYS[2] static hash, KEYS[3] load hash, KEYS[4] version,
-- KEYS[5] changed zset, KEYS[6] load-changed zset
-- Returns {now, version, json array of changed records, "id busy held" lines, {dead id, ...}, live count}
-- (two strings rather than thousands of replies: the client parses them in one pass each).
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local cutoff = now - tonumber(ARGV[1])
local version = redis.call('GET', KEYS[4]) or '0'
local records, loads = {}, {}
if version ~= ARGV[2] then
  local after = '(' .. ARGV[2]
  local seen = {}
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], after, '+inf')) do
    local score = redis.call('ZSCORE', KEYS[1], id)
    local static = score and redis.call('HGET', KEYS[2], id)
    if static then
      seen[id] = true
      local busy, held = string.match(redis.call('HGET', KEYS[3], id) or '0 0', '^(%S+) (%S+)$')
      records[#records + 1] = string.sub(static, 1, -2) .. ',"busy":' .. busy .. ',"held":' .. held
                              .. ',"heartbeat_age":' .. string.format('%.6f', math.max(0, now - tonumber(score))) .. '}'
    end
  end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[6], after, '+inf')) do
    if not seen[id] then
      local load = redis.call('HGET', KEYS[3], id)
      if load then
        loads[#loads + 1] = id .. ' ' .. load
      end
    end
  end
end
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. cutoff)
local live = redis.call('ZCOUNT', KEYS[1], cutoff, '+inf')
return {tostring(now), version, '[' .. table.concat(records, ',') .. ']', table.concat(loads, '\n'), dead, live}
