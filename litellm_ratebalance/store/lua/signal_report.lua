-- signal_report: record what one deployment's signals are worth (which server answers its metrics endpoint,
-- the problems of its signals), for `status`. Any replica that scrapes the deployment writes it; the last
-- write wins, and the record lapses when no replica renews it.
--
-- Clock: Redis server TIME (milliseconds), stored as the report's time.
-- KEYS[1]  hash of the deployment's signal report
-- ARGV[1]  server answering ("" when none is recognised)
-- ARGV[2]  problem codes, comma-separated ("" when none)
-- ARGV[3]  detail (one line per problem)
-- ARGV[4]  time-to-live of the report, ms (> 0)
-- Returns  the report's time, ms

local report = KEYS[1]
local ttl = tonumber(ARGV[4])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', report, 'server', ARGV[1], 'problems', ARGV[2], 'detail', ARGV[3], 'at', now)
redis.call('PEXPIRE', report, ttl)
return now
