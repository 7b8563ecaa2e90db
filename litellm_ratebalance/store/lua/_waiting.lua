-- _waiting: the highest tier waiting for a deployment in any replica (see waiting_publish.lua); included in
-- concurrency_acquire and waiting_publish at their "--#include _waiting" line, never run alone. The embedded store's copy:
-- litellm_ratebalance/store/peers.py (MemoryPeerStore).
--
-- highest_waiting(waiting, now)
--   waiting  sorted set of waiting entries: member = "<rank>:<replica>", score = expiry (ms)
--   now      Redis server TIME of the caller, ms; an entry is alive while now < its expiry
-- Returns the highest rank of a live entry, -1 when none (expired entries are dropped).
local function highest_waiting(waiting, now)
  redis.call('ZREMRANGEBYSCORE', waiting, '-inf', now)
  local highest = -1
  for _, member in ipairs(redis.call('ZRANGE', waiting, 0, -1)) do
    local rank = tonumber(string.match(member, '^(%d+):'))
    if rank and rank > highest then highest = rank end
  end
  return highest
end
