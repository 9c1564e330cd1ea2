-- Count one more host that copied an object from a remote store into its cache (objects/s3.py).
-- KEYS[1] gl:obj:<oid>. Only a recorded object counts: a record already forgotten is not made again.
-- Returns the new count, or false (nil) when there is no record.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
return redis.call('HINCRBY', KEYS[1], 'fetches', 1)
