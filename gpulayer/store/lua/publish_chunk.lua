-- Publish a chunk of a batch in one step: its messages in order, its queue's bell, who sent them and in which
-- batch. One script, so a replica (and a replica promoted by a failover) has the whole chunk or none of it: a
-- client whose connection broke mid-call asks the new primary whether the chunk's first job is in its batch
-- (engine/publish.py) and sends it again only if not.
-- KEYS[1] the queue's list, KEYS[2] its bell, KEYS[3] the sender's jobs (keys.client_jobs), KEYS[4] the batch's
-- members (keys.batch), KEYS[5] keys.CLIENTS, KEYS[6] keys.BATCHES (the index a short id is looked up in)
-- ARGV[1] jobs in the chunk (n), ARGV[2] now (seconds), ARGV[3] tokens a bell keeps, ARGV[4] seconds the records
-- are kept, ARGV[5] the sender's identity, ARGV[6] the batch id, ARGV[7 .. 6+n] the messages (kombu's JSON),
-- ARGV[7+n .. 6+2n] their ids
local n = tonumber(ARGV[1])
local step = 1000  -- values per command (Lua's unpack has a bound)
for i = 7, 6 + n, step do
  redis.call('LPUSH', KEYS[1], unpack(ARGV, i, math.min(i + step - 1, 6 + n)))
end
for i = 7 + n, 6 + 2 * n, step do
  local last = math.min(i + step - 1, 6 + 2 * n)
  local scored = {}
  for j = i, last do
    scored[#scored + 1] = ARGV[2]
    scored[#scored + 1] = ARGV[j]
  end
  redis.call('ZADD', KEYS[3], unpack(scored))
  redis.call('SADD', KEYS[4], unpack(ARGV, i, last))
end
redis.call('EXPIRE', KEYS[3], ARGV[4])
redis.call('EXPIRE', KEYS[4], ARGV[4])
redis.call('SADD', KEYS[5], ARGV[5])
redis.call('ZADD', KEYS[6], ARGV[2], ARGV[6])
for _ = 1, math.min(n, tonumber(ARGV[3])) do  -- a bigger chunk wakes no more workers
  redis.call('LPUSH', KEYS[2], 1)
end
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[3]) - 1)
return n
