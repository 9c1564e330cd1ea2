-- End the fair-share holds of jobs that leave a worker without its take's ack: given back unstarted (not
-- charged), requeued after their worker died or dropped for good (charged for the time they held a slot).
-- KEYS[1..5] keys.FAIR_KEYS (users, taken, running, usage, waiting); ARGV[1] now (Unix time), ARGV[2] the
-- usage half-life (seconds), ARGV[3] 1 to charge the time, 0 not to, ARGV[4..] delivery tags.
-- The same steps as take.lua's release of an acked job; a tag with no hold (released already) is skipped.
local taken, running, usage = KEYS[2], KEYS[3], KEYS[4]
local now, half, charge = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3] == '1'
local ended = 0
for i = 4, #ARGV do
  local held = redis.call('HGET', taken, ARGV[i])
  if held then
    redis.call('HDEL', taken, ARGV[i])
    local v = {}  -- user, start, weight, GPUs[, slots, gangs] (a gang node's hold: reserve.lua)
    for part in string.gmatch(held, '[^\t]+') do v[#v + 1] = part end
    if #v >= 4 then
      local user, start, w, g = v[1], tonumber(v[2]), tonumber(v[3]), tonumber(v[4])
      redis.call('HINCRBY', running, 'slots:' .. user, -tonumber(v[5] or '1'))
      if g > 0 then redis.call('HINCRBY', running, 'gpus:' .. user, -g) end
      if tonumber(v[6] or '0') > 0 then redis.call('HINCRBY', running, 'gangs:' .. user, -tonumber(v[6])) end
      redis.call('HINCRBYFLOAT', running, 'weight:' .. user, -w)
      redis.call('HINCRBYFLOAT', running, 'since:' .. user, -w * start)
      if charge then
        local old = tonumber(redis.call('HGET', usage, 'u:' .. user) or '0')
        local at = tonumber(redis.call('HGET', usage, 'at:' .. user) or ARGV[1])
        local t = math.max(now, at)
        old = old * math.pow(2, -(t - at) / half)
        redis.call('HSET', usage, 'u:' .. user, tostring(old + w * math.max(0, now - start)), 'at:' .. user,
                   tostring(t))
      end
      ended = ended + 1
    end
  end
end
return ended
