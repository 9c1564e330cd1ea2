-- A worker re-asserts, on a primary it has not re-asserted on yet (a failover), what it runs: its slot-ledger entry
-- (its gangs' slots, from its own process, plus the orders waiting in its list that it has not taken), the gang
-- nodes it claims, and that it has done so. The coordinator places nothing until the live workers have.
-- KEYS[1] slots-held hash, KEYS[2] the worker's orders list, KEYS[3] reconciled hash, KEYS[4] claims hash,
-- KEYS[5] primary-seen hash
-- ARGV[1] worker id, ARGV[2] epoch, ARGV[3] slots its running gang nodes hold, ARGV[4] JSON list of those nodes
-- ("<gang> <attempt> <node>"), ARGV[5..] every order this worker life took (an order back in the list because
-- its pop was lost in the failover is not counted again: the agent skips it)
-- Returns the slots now held in the ledger for the worker.
local taken = {}
for i = 5, #ARGV do taken[ARGV[i]] = true end
local held = tonumber(ARGV[3])
local claims = cjson.decode(ARGV[4])
if type(claims) ~= 'table' then claims = {} end
for _, raw in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
  local ok, order = pcall(cjson.decode, raw)
  if ok and type(order) == 'table' and type(order['spec']) == 'table' then
    local id = order['gang_id'] .. ' ' .. tostring(order['attempt']) .. ' ' .. tostring(order['node_rank'])
    if not taken[id] then
      taken[id] = true
      held = held + tonumber(order['spec']['procs_per_node'] or 0)
      claims[#claims + 1] = id
    end
  end
end
if held > 0 then
  redis.call('HSET', KEYS[1], ARGV[1], held)
else
  redis.call('HDEL', KEYS[1], ARGV[1])
end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
if #claims == 0 then
  redis.call('HSET', KEYS[4], ARGV[1], '[]')
else
  redis.call('HSET', KEYS[4], ARGV[1], cjson.encode(claims))
end
local t = redis.call('TIME')
redis.call('HSETNX', KEYS[5], ARGV[2], string.format('%d.%06d', t[1], t[2]))
return held
