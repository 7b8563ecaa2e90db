-- waiting_publish: record which tiers have requests waiting in one replica's queue for a deployment, and read
-- the highest tier waiting in any replica, atomically. concurrency_acquire refuses a lease to a lower tier
-- while an entry of a higher one is alive (see its ARGV[6]), so a top-tier request queued in one replica
-- holds back the lower tiers of every replica.
--
-- Clock: Redis server TIME (milliseconds). An entry is alive while now < its expiry; a replica renews its
-- entries while its requests wait and clears them when its queue empties, and a crashed replica's entries
-- lapse after their time-to-live.
-- KEYS[1]  sorted set of the deployment's waiting entries: member = "<rank>:<replica>", score = expiry (ms)
-- ARGV[1]  replica name
-- ARGV[2]  time-to-live of the entries, ms (> 0)
-- ARGV[3..] the ranks (tiers, 0 = lowest) with requests waiting in that replica now; none: it waits for none
-- Returns  the highest rank waiting in any replica after the update, -1 when none
--#include _waiting

local waiting = KEYS[1]
local replica = ARGV[1]
local ttl = tonumber(ARGV[2])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

redis.call('ZREMRANGEBYSCORE', waiting, '-inf', now)
for _, member in ipairs(redis.call('ZRANGE', waiting, 0, -1)) do
  if string.match(member, '^%d+:(.*)$') == replica then redis.call('ZREM', waiting, member) end
end
for i = 3, #ARGV do
  redis.call('ZADD', waiting, now + ttl, tostring(tonumber(ARGV[i])) .. ':' .. replica)
end
if #ARGV >= 3 then redis.call('PEXPIRE', waiting, 2 * ttl) end

return highest_waiting(waiting, now)
