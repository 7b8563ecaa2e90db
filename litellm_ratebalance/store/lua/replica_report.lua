-- replica_report: one proxy replica says how its store calls went, and replicas silent for too long are
-- forgotten, atomically. `litellm-ratebalance status` reads what is left (one entry per live replica).
--
-- Clock: Redis server TIME (milliseconds): when the report arrived, and which reports are too old.
-- KEYS[1]  sorted set of replicas: member = replica id (escaped), score = time of its last report (ms)
-- KEYS[2]  hash of reports: field = replica id, value = the report (JSON, opaque here)
-- ARGV[1]  replica id (escaped)
-- ARGV[2]  the report
-- ARGV[3]  how long a report stays (ms): older replicas are dropped; both keys expire this long after the
--          last report of any replica
-- Returns  {now_ms, replicas alive (this one included)}

local seen, reports = KEYS[1], KEYS[2]
local id, report, keep = ARGV[1], ARGV[2], tonumber(ARGV[3])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local gone = redis.call('ZRANGEBYSCORE', seen, '-inf', now - keep)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', seen, '-inf', now - keep)
  redis.call('HDEL', reports, unpack(gone))
end
redis.call('ZADD', seen, now, id)
redis.call('HSET', reports, id, report)
redis.call('PEXPIRE', seen, keep)
redis.call('PEXPIRE', reports, keep)
return {now, redis.call('ZCARD', seen)}
