-- peer_exchange: one replica's state of a deployment in, every other live replica's out, atomically (what
-- the replicas pool so that they protect one server together: their learned concurrency limits, learned
-- answer lengths and top-tier demand; the state is opaque here).
--
-- Clock: Redis server TIME (milliseconds). A replica's state is alive while now < its expiry; the state of a
-- replica that stopped exchanging (crashed) is dropped once it lapses.
-- KEYS[1]  sorted set of the deployment's replicas: member = replica name, score = expiry (ms)
-- KEYS[2]  hash of their states: field = replica name, value = its state
-- ARGV[1]  replica name
-- ARGV[2]  time-to-live of its state, ms (> 0)
-- ARGV[3]  its state
-- Returns  {name, state, name, state, ...} of the other live replicas

local replicas, states = KEYS[1], KEYS[2]
local replica = ARGV[1]
local ttl = tonumber(ARGV[2])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

for _, gone in ipairs(redis.call('ZRANGEBYSCORE', replicas, '-inf', now)) do
  redis.call('HDEL', states, gone)
end
redis.call('ZREMRANGEBYSCORE', replicas, '-inf', now)
redis.call('ZADD', replicas, now + ttl, replica)
redis.call('HSET', states, replica, ARGV[3])
redis.call('PEXPIRE', replicas, 2 * ttl)
redis.call('PEXPIRE', states, 2 * ttl)

local others = {}
for _, name in ipairs(redis.call('ZRANGE', replicas, 0, -1)) do
  if name ~= replica then
    local state = redis.call('HGET', states, name)
    if state then
      others[#others + 1] = name
      others[#others + 1] = state
    end
  end
end
return others
