-- concurrency_release: give back one lease of a deployment (its slot and its reserved tokens), atomically.
--
-- Clock: Redis server TIME (milliseconds), only to purge expired leases (now >= expiry) first.
-- KEYS[1]  sorted set of the deployment's leases: member = lease id, score = expiry (ms)
-- KEYS[2]  hash of reserved tokens: field "l:<lease id>" = tokens of that lease, field "total" = their sum
-- ARGV[1]  lease id
-- Cost metering (optional): KEYS[3] the deployment's cost state, ARGV[2..8] the end mark's arguments (see
--           _sharing.lua); the request's end is marked in this same step, after the release.
-- Returns  {released 0|1 (0: unknown or already expired), leases alive, reserved tokens}, after the release;
--           an end mark appends {now ms, epoch ms, integral (string), share (string)}.

--#include _sharing
--#include _lease_purge

local leases, costs = KEYS[1], KEYS[2]
local id = ARGV[1]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

purge_expired(leases, costs, now)

local released = redis.call('ZREM', leases, id)
if released == 1 then
  local cost = tonumber(redis.call('HGET', costs, 'l:' .. id)) or 0
  redis.call('HDEL', costs, 'l:' .. id)
  if cost > 0 then redis.call('HINCRBY', costs, 'total', -cost) end
end
local alive = redis.call('ZCARD', leases)
local total = tonumber(redis.call('HGET', costs, 'total')) or 0
if #KEYS >= 3 then
  local mark = sharing_mark(KEYS[3], alive, now, {unpack(ARGV, 2, 8)})
  return {released, alive, total, now, mark[1], mark[2], mark[3]}
end
return {released, alive, total}
