-- routing_sync: add a replica's pending rate samples to the current time bucket of a model group, store
-- its latest rate-limit headers, and return the buckets it asked for, all in one atomic step.
--
-- Clock: Redis server TIME (milliseconds) picks the current bucket and stamps the headers; the caller's
-- clock is never used. The caller only guesses which bucket keys to send (from the server time of its
-- previous call); when the current bucket is not among them nothing is written and 0 is returned in
-- `written`, so the caller retries with the right keys.
--
-- KEYS[1]   hash of the latest rate-limit headers per deployment. Fields <p>|id (raw deployment id),
--           <p>|rr, <p>|rt (remaining requests / tokens), <p>|lr, <p>|lt (limits), <p>|rs (seconds to
--           reset), <p>|at (ms, server time written); -1 = not reported. <p> = escaped deployment id.
-- KEYS[2..] hashes of consecutive time buckets, the first one being bucket ARGV[2]. Fields per deployment
--           <p>|id, <p>|n (samples), <p>|f (failures), <p>|s / <p>|q (sum / sum of squares of the rates,
--           tokens/s), <p>|l (sum of successful latencies, s), <p>|k (tokens), <p>|ts / <p>|tn (sum / count
--           of time to first token, s), <p>|h<i> (samples in rate histogram bin i).
-- ARGV[1]   bucket width, ms (bucket index = floor(now_ms / width))
-- ARGV[2]   index of the bucket of KEYS[2]
-- ARGV[3]   time-to-live of a bucket key after its last write, ms
-- ARGV[4]   time-to-live of the headers key after its last write, ms
-- ARGV[5]   d, the number of deployment deltas that follow; each is
--           <p>, id, n, f, s, q, l, k, ts, tn, b, then b pairs (bin index, count)
-- then      h, the number of header observations that follow; each is <p>, id, rr, rt, lr, lt, rs
-- Returns   {now_ms, written 0|1, HGETALL of KEYS[2], ..., HGETALL of KEYS[#KEYS], HGETALL of KEYS[1]}
--           `written` is 1 when there were no deltas. Header observations are always written.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local width = tonumber(ARGV[1])
local first = tonumber(ARGV[2])
local bucket_ttl = tonumber(ARGV[3])
local limits_ttl = tonumber(ARGV[4])
local current = math.floor(now / width)
local slot = current - first + 2

local pos = 5
local n_deltas = tonumber(ARGV[pos])
pos = pos + 1
local written = 1
if n_deltas > 0 then
  if slot < 2 or slot > #KEYS then
    written = 0
  end
  local key = KEYS[slot]
  for _ = 1, n_deltas do
    local p = ARGV[pos]
    local id = ARGV[pos + 1]
    local n_bins = tonumber(ARGV[pos + 10])
    if written == 1 then
      redis.call('HSET', key, p .. '|id', id)
      local ints = {{'n', 2}, {'f', 3}, {'k', 7}, {'tn', 9}}
      for _, spec in ipairs(ints) do
        local v = tonumber(ARGV[pos + spec[2]])
        if v ~= 0 then redis.call('HINCRBY', key, p .. '|' .. spec[1], v) end
      end
      local floats = {{'s', 4}, {'q', 5}, {'l', 6}, {'ts', 8}}
      for _, spec in ipairs(floats) do
        local v = tonumber(ARGV[pos + spec[2]])
        if v ~= 0 then redis.call('HINCRBYFLOAT', key, p .. '|' .. spec[1], ARGV[pos + spec[2]]) end
      end
      for b = 0, n_bins - 1 do
        local bin = ARGV[pos + 11 + 2 * b]
        local count = tonumber(ARGV[pos + 12 + 2 * b])
        if count ~= 0 then redis.call('HINCRBY', key, p .. '|h' .. bin, count) end
      end
    end
    pos = pos + 11 + 2 * n_bins
  end
  if written == 1 then
    redis.call('PEXPIRE', key, bucket_ttl)
  end
end

local n_limits = tonumber(ARGV[pos])
pos = pos + 1
for _ = 1, n_limits do
  local p = ARGV[pos]
  redis.call('HSET', KEYS[1], p .. '|id', ARGV[pos + 1], p .. '|rr', ARGV[pos + 2], p .. '|rt', ARGV[pos + 3],
    p .. '|lr', ARGV[pos + 4], p .. '|lt', ARGV[pos + 5], p .. '|rs', ARGV[pos + 6], p .. '|at', now)
  pos = pos + 7
end
if n_limits > 0 then
  redis.call('PEXPIRE', KEYS[1], limits_ttl)
end

local reply = {now, written}
for i = 2, #KEYS do
  reply[#reply + 1] = redis.call('HGETALL', KEYS[i])
end
reply[#reply + 1] = redis.call('HGETALL', KEYS[1])
return reply
