-- cost_read: a deployment's efficiency sums (attributed GPU-seconds and output tokens), decayed to now.
--
-- Clock: Redis server TIME (milliseconds). Read only.
-- KEYS[1]  hash of the deployment's cost state (see _sharing.lua)
-- ARGV[1]  half-life of the efficiency sums, ms (> 0)
-- Returns  {found 0|1, GPU-seconds (string), output tokens (string), now ms}; found 0: no request has ended
--          on the deployment within the state's time-to-live (both sums "0").

local state = KEYS[1]
local half_life = tonumber(ARGV[1])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local saved = redis.call('HMGET', state, 'eff_at', 'eff_gpu', 'eff_tok')
local eff_at = tonumber(saved[1])
if not eff_at then
  return {0, '0', '0', now}
end
local factor = 1
if now > eff_at then factor = math.pow(0.5, (now - eff_at) / half_life) end
return {1, string.format('%.17g', (tonumber(saved[2]) or 0) * factor),
  string.format('%.17g', (tonumber(saved[3]) or 0) * factor), now}
