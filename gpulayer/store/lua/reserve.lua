-- Reserve a gang's slots on every chosen worker at once, or on none; on success the gang is running.
-- KEYS[1] slots-held hash, KEYS[2] workers info hash, KEYS[3] gang hash, KEYS[4] waiting gangs zset,
-- KEYS[5..9] the fair-share keys (keys.FAIR_KEYS: users, taken, running, usage, waiting)
-- ARGV[1] procs per node, ARGV[2] attempt, ARGV[3] placement JSON, ARGV[4] reason, ARGV[5] gang id,
-- ARGV[6] the gang's user ("" for none), ARGV[7] GPUs per process, ARGV[8] now (Unix time), ARGV[9..] worker ids
-- Returns {1} on success, {0, worker id, free} when that worker no longer has room,
-- {2} when this attempt is already reserved (a second coordinator for the same attempt),
-- {3} when the gang no longer waits (cancelled, or ended by its timeout),
-- {4, reason} when its user's quota (max_slots, max_gpus, max_gangs) holds it back for now.
-- With fair share on and a policy for its user, each node's slots are held for the user (keys.FAIR_TAKEN field
-- "gang:<id>:<attempt>:<worker>", the first node's also counting the gang) until GangStore.release ends it.
-- A gang hash without a state (benchmarks/fleet_scale.py's bare reservations) only records the attempt.
local state = redis.call('HGET', KEYS[3], 'state')
if redis.call('HGET', KEYS[3], 'reserved_attempt') == ARGV[2] then return {2} end
if state and state ~= 'waiting' then return {3} end
local m = tonumber(ARGV[1])
local first = 9
local user, g, now = ARGV[6], tonumber(ARGV[7]), ARGV[8]
local users, taken, running = KEYS[5], KEYS[6], KEYS[7]
local policy = nil
if user ~= '' and redis.call('EXISTS', users) == 1 then
  local raw = redis.call('HGET', users, user)
  local ok, p = pcall(cjson.decode, raw or '')
  if raw and ok and type(p) == 'table' then policy = p end
end
if policy then
  local slots = m * (#ARGV - first + 1)
  local checks = {{'max_slots', 'slots', slots, 'slots'}, {'max_gpus', 'gpus', slots * g, 'GPUs'},
                  {'max_gangs', 'gangs', 1, 'distributed jobs'}}
  for _, c in ipairs(checks) do
    local limit = policy[c[1]]
    if type(limit) == 'number' and c[3] > 0 then
      local used = tonumber(redis.call('HGET', running, c[2] .. ':' .. user) or '0')
      if used + c[3] > limit then
        local reason = user .. ': ' .. used .. ' of ' .. limit .. ' ' .. c[4] .. ' in use (quota)'
        redis.call('HSET', KEYS[9], user, reason)
        return {4, reason}
      end
    end
  end
end
for i = first, #ARGV do
  local info = redis.call('HGET', KEYS[2], ARGV[i])
  if not info then return {0, ARGV[i], -1} end
  local w = cjson.decode(info)
  local held = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  local free = w['slots'] - w['busy'] - held
  if free < m then return {0, ARGV[i], free} end
end
for i = first, #ARGV do
  redis.call('HINCRBY', KEYS[1], ARGV[i], m)
  if policy then  -- (the same counters take.lua keeps for a job, per node)
    local gpus = m * g
    local w = gpus > 0 and gpus or m
    local gangs = i == first and 1 or 0
    redis.call('HSET', taken, 'gang:' .. ARGV[5] .. ':' .. ARGV[2] .. ':' .. ARGV[i],
               user .. '\t' .. now .. '\t' .. w .. '\t' .. gpus .. '\t' .. m .. '\t' .. gangs)
    redis.call('HINCRBY', running, 'slots:' .. user, m)
    if gpus > 0 then redis.call('HINCRBY', running, 'gpus:' .. user, gpus) end
    if gangs > 0 then redis.call('HINCRBY', running, 'gangs:' .. user, 1) end
    redis.call('HINCRBYFLOAT', running, 'weight:' .. user, w)
    redis.call('HINCRBYFLOAT', running, 'since:' .. user, w * tonumber(now))
  end
end
if policy then redis.call('HDEL', KEYS[9], user) end
redis.call('HSET', KEYS[3], 'reserved_attempt', ARGV[2])
if state then
  redis.call('HSET', KEYS[3], 'state', 'running', 'reason', ARGV[4], 'placement', ARGV[3], 'attempt', ARGV[2])
  redis.call('ZREM', KEYS[4], ARGV[5])
end
return {1}
