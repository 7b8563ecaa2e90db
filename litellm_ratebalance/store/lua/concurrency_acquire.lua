-- concurrency_acquire: take one in-flight slot (a lease) of a deployment if its caps allow, atomically.
--
-- Clock: Redis server TIME (milliseconds); the caller's clock is never used. A lease is alive while
-- now < its expiry; expired leases are purged (and their tokens returned) before anything is decided.
-- KEYS[1]  sorted set of the deployment's leases: member = lease id, score = expiry (ms)
-- KEYS[2]  hash of reserved tokens: field "l:<lease id>" = tokens of that lease, field "total" = their sum
-- ARGV[1]  lease id
-- ARGV[2]  slot cap: the lease is taken only while fewer than this many leases are alive
-- ARGV[3]  lease time-to-live, ms (the owner renews it; a crashed owner's lease frees after this)
-- ARGV[4]  tokens this request reserves (prompt + max_tokens estimate), >= 0
-- ARGV[5]  token cap: the lease is taken only if total + tokens <= cap; -1 for no token cap
-- KEYS[3]  sorted set of the tiers waiting in the replicas' queues (see waiting_publish.lua)
-- ARGV[6]  the request's rank (tier, 0 = lowest): refused while a higher rank waits in any replica; -1 to
--           skip that check
-- Cost metering (optional): KEYS[4] the deployment's cost state, ARGV[7..13] the start mark's arguments
--           (see _sharing.lua); a newly taken lease marks the request's start in this same step.
-- Returns  {acquired 0|1, reason 0 (taken) | 1 (slot cap) | 2 (token cap) | 3 (a higher tier waits),
--           leases alive, reserved tokens, now_ms}; counts are after the lease when taken. Taking a lease id that is already alive renews
--           it and reports it taken (idempotent; its tokens are not counted twice, no mark). A start mark
--           appends {epoch ms, integral (string), share ""}.

--#include _sharing
--#include _lease_purge
--#include _waiting

local leases, costs = KEYS[1], KEYS[2]
local id = ARGV[1]
local slot_cap = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local token_cap = tonumber(ARGV[5])
local rank = tonumber(ARGV[6])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

purge_expired(leases, costs, now)

local alive = redis.call('ZCARD', leases)
local total = tonumber(redis.call('HGET', costs, 'total')) or 0

if redis.call('ZSCORE', leases, id) then
  redis.call('ZADD', leases, now + ttl, id)
  redis.call('PEXPIRE', leases, 2 * ttl)
  redis.call('PEXPIRE', costs, 2 * ttl)
  return {1, 0, alive, total, now}
end
if rank >= 0 and highest_waiting(KEYS[3], now) > rank then
  return {0, 3, alive, total, now}
end
if alive >= slot_cap then
  return {0, 1, alive, total, now}
end
if token_cap >= 0 and total + cost > token_cap then
  return {0, 2, alive, total, now}
end

redis.call('ZADD', leases, now + ttl, id)
redis.call('HSET', costs, 'l:' .. id, cost)
total = redis.call('HINCRBY', costs, 'total', cost)
-- Keys outlive every lease in them (each write pushes this out), then vanish with an idle deployment.
redis.call('PEXPIRE', leases, 2 * ttl)
redis.call('PEXPIRE', costs, 2 * ttl)
if #KEYS >= 4 then
  local mark = sharing_mark(KEYS[4], alive + 1, now, {unpack(ARGV, 7, 13)})
  return {1, 0, alive + 1, total, now, mark[1], mark[2], mark[3]}
end
return {1, 0, alive + 1, total, now}
