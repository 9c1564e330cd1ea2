-- Store the results a worker's main process holds, ack what it finished, then take up to ARGV[1] messages of its
-- queues, each recorded as taken, in one step.
-- KEYS[1..n] the queue keys in the order to try (kombu's priority keys included), then kombu's unacked hash,
-- kombu's unacked index, and the worker life's delivery records (keys.inflight), then for each of ARGV[3]
-- results its result key and its job's done marker
-- ARGV[1] how many to take, ARGV[2] the time for the unacked index (the worker's clock, as kombu writes it),
-- ARGV[3] how many results to store (r), then r pairs: encoded result, expires (seconds); then the delivery
-- tags to ack: each one's unacked entry, index entry and delivery record go
-- Returns {queue key, message, queue key, message, ...} (empty when the queues are).
-- A taken message is at every instant in its queue, or unacked with a record: nothing a SIGKILL can lose. A
-- result goes in before the acks of the same call, at most once per job (as store_once.lua stores it).
local r = tonumber(ARGV[3])
local n = #KEYS - 3 - 2 * r
local unacked, index, records = KEYS[n + 1], KEYS[n + 2], KEYS[n + 3]
for j = 1, r do
  local key, done = KEYS[n + 2 + 2 * j], KEYS[n + 3 + 2 * j]
  local value, expires = ARGV[2 + 2 * j], ARGV[3 + 2 * j]
  if redis.call('EXISTS', done) == 0 then
    redis.call('SET', done, '1', 'EX', expires)
    redis.call('SETEX', key, expires, value)
    redis.call('PUBLISH', key, value)
  end
end
for i = 4 + 2 * r, #ARGV do
  redis.call('ZREM', index, ARGV[i])
  redis.call('HDEL', unacked, ARGV[i])
  redis.call('HDEL', records, ARGV[i])
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

local out, want = {}, tonumber(ARGV[1])
for i = 1, n do
  while #out < 2 * want do
    local m = redis.call('RPOP', KEYS[i])
    if not m then break end
    local ok, msg = pcall(envelope, m)
    local props = ok and type(msg) == 'table' and msg['properties']
    local info = props and props['delivery_info']
    if props and info and type(props['delivery_tag']) == 'string' then
      local tag = props['delivery_tag']
      redis.call('ZADD', index, ARGV[2], tag)
      redis.call('HSET', unacked, tag, '[' .. m .. ',' .. cjson.encode(info['exchange']) .. ','
                                        .. cjson.encode(info['routing_key']) .. ']')
      local headers = msg['headers']
      local id = type(headers) == 'table' and headers['id']
      if type(id) == 'string' then redis.call('HSET', records, tag, id) end
    end
    -- (a message that is not kombu's JSON cannot be recorded; the worker logs it and drops it, as kombu would)
    out[#out + 1] = KEYS[i]
    out[#out + 1] = m
  end
  if #out >= 2 * want then break end
end
return out
