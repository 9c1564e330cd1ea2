-- Publish one job message: the message, its queue's bell, and who sent it (`gpulayer cancel --all-mine`).
-- KEYS[1] the queue's list, KEYS[2] its bell, KEYS[3] the sender's jobs (keys.client_jobs), KEYS[4] keys.CLIENTS
-- ARGV[1] the message (kombu's JSON), ARGV[2] the job id, ARGV[3] now (seconds), ARGV[4] tokens a bell keeps,
-- ARGV[5] seconds a sender's record is kept, or "" (its expiry and the senders' set were refreshed lately),
-- ARGV[6] the sender's identity
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[2])
if ARGV[5] ~= '' then
  redis.call('EXPIRE', KEYS[3], ARGV[5])
  redis.call('SADD', KEYS[4], ARGV[6])
end
redis.call('LPUSH', KEYS[2], 1)
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[4]) - 1)
return 1
