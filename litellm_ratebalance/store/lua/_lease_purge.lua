-- _lease_purge: drop a deployment's expired leases and give their reserved tokens back; the first step of
-- concurrency_acquire, concurrency_release and concurrency_renew (included in them by the loader at its
-- "--#include _lease_purge" line; never run alone). The embedded store's copy:
-- litellm_ratebalance/store/concurrency.py (MemoryConcurrencyStore).
--
-- purge_expired(leases, costs, now)
--   leases   sorted set of the deployment's leases: member = lease id, score = expiry (ms)
--   costs    hash of reserved tokens: field "l:<lease id>" = tokens of that lease, field "total" = their sum
--   now      Redis server TIME of the caller, ms; a lease is expired when now >= its expiry
-- Returns nothing; the leases and their tokens are gone from both keys.
local function purge_expired(leases, costs, now)
  local expired = redis.call('ZRANGEBYSCORE', leases, '-inf', now)
  if #expired > 0 then
    local freed = 0
    for _, lease in ipairs(expired) do
      freed = freed + (tonumber(redis.call('HGET', costs, 'l:' .. lease)) or 0)
      redis.call('HDEL', costs, 'l:' .. lease)
    end
    redis.call('ZREMRANGEBYSCORE', leases, '-inf', now)
    -- HINCRBY refuses "-0" (Lua's text for minus zero): only write a change.
    if freed > 0 then redis.call('HINCRBY', costs, 'total', -freed) end
  end
end
