-- Add holders to objects, all or none: refused, naming the first object that is gone or being deleted.
-- KEYS: gl:obj:<oid>, its holders, ... (a pair per object; an object may come more than once)
-- ARGV: oid, holder, expiry (unix time), ... (a triple per pair of KEYS)
-- A holder already there keeps the later of its two expiries. Returns false, or the oid refused.
for i = 1, #KEYS, 2 do
  local state = redis.call('HGET', KEYS[i], 'state')
  if state ~= 'live' then
    return ARGV[(i - 1) / 2 * 3 + 1]
  end
end
for i = 1, #KEYS, 2 do
  local j = (i - 1) / 2 * 3
  local holder, expiry = ARGV[j + 2], tonumber(ARGV[j + 3])
  local had = tonumber(redis.call('ZSCORE', KEYS[i + 1], holder))
  if had == nil or had < expiry then
    redis.call('ZADD', KEYS[i + 1], expiry, holder)
  end
end
return false
