-- Store a job's result at most once: a result already stored is never overwritten by a rerun.
-- KEYS[1] Celery's result key, KEYS[2] the job's done marker
-- ARGV[1] value, ARGV[2] expires (seconds), ARGV[3] "1" if this state is final (success or failure)
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if ARGV[3] == '1' then redis.call('SET', KEYS[2], '1', 'EX', ARGV[2]) end
redis.call('SETEX', KEYS[1], ARGV[2], ARGV[1])
redis.call('PUBLISH', KEYS[1], ARGV[1])
return 1
