-- Every worker heard from within ARGV[1] seconds, with the registry version it reflects.
-- Registry.read sends it only where its direct read (Registry._read_packed, no script) cannot serve:
-- a live worker without a packed record, or packed records out of sync with the version.
-- KEYS[1] workers zset, KEYS[2] info hash, KEYS[3] static hash, KEYS[4] load hash, KEYS[5] version,
-- KEYS[6] packed hash, KEYS[7] packed-synced version
-- Returns {now, version, synced (1/0), packed, json}: packed joins, for each worker with a packed
-- record (only while they are in sync with the version), its record's fields and its last
-- heartbeat (Redis time), all with \31; json is a JSON array of the other workers' WorkerInfo
-- records (busy, held and heartbeat age filled in). The packed records come in one HGETALL (a
-- redis.call per worker cost Redis 77 ms at 10,000 workers), no string building.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local version = redis.call('GET', KEYS[5]) or '0'
local synced = (redis.call('GET', KEYS[7]) or '0') == version
local live = redis.call('ZRANGEBYSCORE', KEYS[1], now - tonumber(ARGV[1]), '+inf', 'WITHSCORES')
local packed, out, records = {}, {}, {}
if synced then
  local all = redis.call('HGETALL', KEYS[6])
  for i = 1, #all, 2 do records[all[i]] = all[i + 1] end
end
for i = 1, #live, 2 do
  local id = live[i]
  local rec = records[id]
  if rec then
    packed[#packed + 1] = rec
    packed[#packed + 1] = live[i + 1]
  else
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
end
return {string.format('%.6f', now), version, synced and 1 or 0, table.concat(packed, '\31'), '[' .. table.concat(out, ',') .. ']'}
