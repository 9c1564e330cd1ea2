-- Store the results a worker's main process holds, ack what it finished, then take up to ARGV[1] messages of its
-- queues, each recorded as taken, in one step.
-- KEYS[1..n] the queue keys in the order to try (kombu's priority keys and users' lists included), then kombu's
-- unacked hash, kombu's unacked index, and the worker life's delivery records (keys.inflight), then (ARGV[4] not
-- 0) the fair-share keys (keys.FAIR_KEYS: users, taken, running, usage, waiting), then for each of ARGV[3]
-- results its result key and its job's done marker
-- ARGV[1] how many to take, ARGV[2] the time for the unacked index (the worker's clock, as kombu writes it),
-- ARGV[3] how many results to store (r), ARGV[4] the usage half-life in seconds (0: no fair-share keys), then r
-- pairs: encoded result, expires (seconds); then the delivery tags to ack: each one's unacked entry, index
-- entry and delivery record go (and its fair-share hold, charged to its user's usage)
-- Returns {queue key, message, queue key, message, ...} (empty when the queues are).
-- A taken message is at every instant in its queue, or unacked with a record: nothing a SIGKILL can lose. A
-- result goes in before the acks of the same call, at most once per job (as store_once.lua stores it).
-- With fair share on (the users hash exists), a job of a user with a policy is taken only within its quotas:
-- one over them goes back where it was (its list is skipped for this take) and the user's reason is written.
local r = tonumber(ARGV[3])
local half = tonumber(ARGV[4])
local f = half > 0 and 5 or 0
local n = #KEYS - 3 - f - 2 * r
local unacked, index, records = KEYS[n + 1], KEYS[n + 2], KEYS[n + 3]
local users, taken, running, usage, waiting = KEYS[n + 4], KEYS[n + 5], KEYS[n + 6], KEYS[n + 7], KEYS[n + 8]
local now = tonumber(ARGV[2])
for j = 1, r do
  local key, done = KEYS[n + f + 2 + 2 * j], KEYS[n + f + 3 + 2 * j]
  local value, expires = ARGV[3 + 2 * j], ARGV[4 + 2 * j]
  if redis.call('EXISTS', done) == 0 then
    redis.call('SET', done, '1', 'EX', expires)
    redis.call('SETEX', key, expires, value)
    redis.call('PUBLISH', key, value)
  end
end

-- A job's fair-share hold ends (as fair_release.lua ends one): its slots back, its slot-seconds charged.
local function release(tag)
  local held = redis.call('HGET', taken, tag)
  if not held then return end
  redis.call('HDEL', taken, tag)
  local v = {}  -- user, start, weight, GPUs[, slots, gangs] (a gang node's hold: reserve.lua)
  for part in string.gmatch(held, '[^\t]+') do v[#v + 1] = part end
  if #v < 4 then return end
  local user, start, w, g = v[1], tonumber(v[2]), tonumber(v[3]), tonumber(v[4])
  redis.call('HINCRBY', running, 'slots:' .. user, -tonumber(v[5] or '1'))
  if g > 0 then redis.call('HINCRBY', running, 'gpus:' .. user, -g) end
  if tonumber(v[6] or '0') > 0 then redis.call('HINCRBY', running, 'gangs:' .. user, -tonumber(v[6])) end
  redis.call('HINCRBYFLOAT', running, 'weight:' .. user, -w)
  redis.call('HINCRBYFLOAT', running, 'since:' .. user, -w * start)
  local old = tonumber(redis.call('HGET', usage, 'u:' .. user) or '0')
  local at = tonumber(redis.call('HGET', usage, 'at:' .. user) or ARGV[2])
  local t = math.max(now, at)  -- (another worker's clock ahead of this one's: no negative decay)
  old = old * math.pow(2, -(t - at) / half)
  redis.call('HSET', usage, 'u:' .. user, tostring(old + w * math.max(0, now - start)), 'at:' .. user, tostring(t))
end

local holds = f > 0 and #ARGV >= 5 + 2 * r and redis.call('EXISTS', taken) == 1  -- (none: no HGET per ack)
for i = 5 + 2 * r, #ARGV do
  redis.call('ZREM', index, ARGV[i])
  redis.call('HDEL', unacked, ARGV[i])
  redis.call('HDEL', records, ARGV[i])
  if holds then release(ARGV[i]) end
end

-- The envelope without its body: kombu writes the body first, and a signed body is base64 (no quote, no
-- backslash), so the JSON after it is decoded alone; anything else is decoded whole.
local function envelope(m)
  local head = '{"body": "'
  if string.sub(m, 1, #head) == head then
    local close = string.find(m, '"', #head + 1, true)
    local slash = string.find(m, '\\', #head + 1, true)
    if close and (not slash or slash > close) then
      return cjson.decode('{' .. string.sub(m, close + 2))
    end
  end
  return cjson.decode(m)
end

local fair = f > 0 and redis.call('EXISTS', users) == 1
local policies = {}
local function policy(user)  -- a user's policy, read once per call; false: none
  if policies[user] == nil then
    local raw = redis.call('HGET', users, user)
    local ok, p = pcall(cjson.decode, raw or '')
    policies[user] = (raw and ok and type(p) == 'table') and p or false
  end
  return policies[user]
end
local function limit(p, field)
  local v = p[field]
  if type(v) == 'number' then return v end
  return nil
end
-- The user and GPUs of a fair-share job, or nil; false with its reason when its user's quota holds it back.
local function admit(msg)
  local headers = type(msg) == 'table' and msg['headers']
  local user = type(headers) == 'table' and headers['gl_client']
  if type(user) ~= 'string' then return nil end
  local p = policy(user)
  if not p then return nil end
  local res = headers['gl_resources']
  local gpus = type(res) == 'table' and tonumber(res['gpus']) or 0
  if gpus == 0 and type(res) == 'table' and res['cuda'] == true then gpus = 1 end
  local slots = tonumber(redis.call('HGET', running, 'slots:' .. user) or '0')
  local max = limit(p, 'max_slots')
  if max and slots + 1 > max then
    return false, user .. ': ' .. slots .. ' of ' .. max .. ' slots in use (quota)', user
  end
  max = limit(p, 'max_gpus')
  if max and gpus > 0 then
    local used = tonumber(redis.call('HGET', running, 'gpus:' .. user) or '0')
    if used + gpus > max then return false, user .. ': ' .. used .. ' of ' .. max .. ' GPUs in use (quota)', user end
  end
  return user, gpus
end

local out, want = {}, tonumber(ARGV[1])
for i = 1, n do
  while #out < 2 * want do
    local m = redis.call('RPOP', KEYS[i])
    if not m then break end
    local ok, msg = pcall(envelope, m)
    local props = ok and type(msg) == 'table' and msg['properties']
    local info = props and props['delivery_info']
    local user, gpus, who
    if fair and props then
      user, gpus, who = admit(msg)
      if user == false then  -- over its quota: back where it was, next in line once the quota allows it
        redis.call('RPUSH', KEYS[i], m)
        redis.call('HSET', waiting, who, gpus)
        break
      end
    end
    if props and info and type(props['delivery_tag']) == 'string' then
      local tag = props['delivery_tag']
      redis.call('ZADD', index, ARGV[2], tag)
      redis.call('HSET', unacked, tag, '[' .. m .. ',' .. cjson.encode(info['exchange']) .. ','
                                        .. cjson.encode(info['routing_key']) .. ']')
      local headers = msg['headers']
      local id = type(headers) == 'table' and headers['id']
      if type(id) == 'string' then redis.call('HSET', records, tag, id) end
      if user then
        local w = gpus > 0 and gpus or 1
        redis.call('HSET', taken, tag, user .. '\t' .. ARGV[2] .. '\t' .. w .. '\t' .. gpus)
        redis.call('HINCRBY', running, 'slots:' .. user, 1)
        if gpus > 0 then redis.call('HINCRBY', running, 'gpus:' .. user, gpus) end
        redis.call('HINCRBYFLOAT', running, 'weight:' .. user, w)
        redis.call('HINCRBYFLOAT', running, 'since:' .. user, w * now)
        redis.call('HDEL', waiting, user)
      end
    end
    -- (a message that is not kombu's JSON cannot be recorded; the worker logs it and drops it, as kombu would)
    out[#out + 1] = KEYS[i]
    out[#out + 1] = m
  end
  if #out >= 2 * want then break end
end
return out
