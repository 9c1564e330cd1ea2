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
    local user, start, w, g = string.match(held, '^(.*)\t([^\t]*)\t([^\t]*)\t([^\t]*)$')
    if user then
      start, w, g = tonumber(start), tonumber(w), tonumber(g)
      redis.call('HINCRBY', running, 'slots:' .. user, -1)
      if g > 0 then redis.call('HINCRBY', running, 'gpus:' .. user, -g) end
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
