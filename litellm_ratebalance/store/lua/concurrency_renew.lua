-- concurrency_renew: push out the expiry of a replica's live leases of one deployment, and report the
-- deployment's totals (with no lease ids it is a read: purge, then count), atomically.
--
-- Clock: Redis server TIME (milliseconds). Expired leases (now >= expiry) are purged first and are NOT
-- revived: a lease that lapsed has given its slot back, and its owner must acquire again.
-- KEYS[1]  sorted set of the deployment's leases: member = lease id, score = expiry (ms)
-- KEYS[2]  hash of reserved tokens: field "l:<lease id>" = tokens of that lease, field "total" = their sum
-- ARGV[1]  lease time-to-live, ms
-- ARGV[2..] lease ids to renew
-- Returns  {leases renewed, leases alive, reserved tokens}

--#include _lease_purge

local leases, costs = KEYS[1], KEYS[2]
local ttl = tonumber(ARGV[1])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

purge_expired(leases, costs, now)

local renewed = 0
for i = 2, #ARGV do
  if redis.call('ZSCORE', leases, ARGV[i]) then
    redis.call('ZADD', leases, 'XX', now + ttl, ARGV[i])
    renewed = renewed + 1
  end
end
if renewed > 0 then
  redis.call('PEXPIRE', leases, 2 * ttl)
  redis.call('PEXPIRE', costs, 2 * ttl)
end
return {renewed, redis.call('ZCARD', leases), tonumber(redis.call('HGET', costs, 'total')) or 0}
