-- Write the packed records of a full read that found them out of sync, and mark them in sync,
-- unless the registry changed since that read (then the next full read tries again).
-- Only workers with a static record get one: a worker of a gpulayer older still writes its JSON
-- record alone and no version, so nothing would tell a reader its packed record went stale.
-- KEYS[1] version, KEYS[2] packed hash, KEYS[3] packed-synced version, KEYS[4] static hash
-- ARGV[1] the version the read saw; then id, packed record ('' for none) pairs. Returns 1 if written.
if (redis.call('GET', KEYS[1]) or '0') ~= ARGV[1] then
  return 0
end
for i = 2, #ARGV, 2 do
  if ARGV[i + 1] == '' or redis.call('HEXISTS', KEYS[4], ARGV[i]) == 0 then
    redis.call('HDEL', KEYS[2], ARGV[i])  -- a record that cannot be packed is read from its JSON
  else
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  end
end
redis.call('SET', KEYS[3], ARGV[1])
return 1
