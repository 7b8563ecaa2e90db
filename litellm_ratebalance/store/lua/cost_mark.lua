-- cost_mark: advance a deployment's processor-sharing integral at the start or end of a request, and at
-- the end charge the request its share, atomically (see litellm_ratebalance/attribution/sharing.py).
--
-- Clock: Redis server TIME (milliseconds); the caller's clock is never used.
-- KEYS[1]  sorted set of the deployment's backpressure leases (member = lease id, score = expiry ms); only
--          read: the leases alive now (expiry > now) are the requests in flight from now on
-- KEYS[2]  hash of the deployment's cost state: epoch (ms), at (ms of the last mark), n (in flight since
--          then), i (the integral, seconds), eff_at (ms), eff_gpu (decayed GPU-seconds), eff_tok (decayed
--          output tokens)
-- ARGV[1]  "start" or "end"
-- ARGV[2]  end: epoch (ms) of the request's start mark; start: ignored
-- ARGV[3]  end: the integral (seconds) at the request's start mark; start: ignored
-- ARGV[4]  end: GPUs of the deployment (a busy second is this many GPU-seconds); start: ignored
-- ARGV[5]  end: the request's output tokens, >= 0; start: ignored
-- ARGV[6]  half-life of the efficiency sums, ms (> 0)
-- ARGV[7]  time-to-live of the cost state, ms (each mark pushes it out)
-- Returns  {epoch ms, integral after the mark (string), share (string, GPU-seconds; "" for a start mark or
--           when the start mark belongs to another epoch), now ms}
-- The interval since the last mark is divided by the count recorded then (every change of the count is
-- followed by a mark); an idle interval adds nothing. A missing state starts a new epoch at now.

local leases, state = KEYS[1], KEYS[2]
local mode = ARGV[1]
local half_life = tonumber(ARGV[6])
local ttl = tonumber(ARGV[7])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local inflight = redis.call('ZCOUNT', leases, '(' .. now, '+inf')

local saved = redis.call('HMGET', state, 'epoch', 'at', 'n', 'i', 'eff_at', 'eff_gpu', 'eff_tok')
local epoch = tonumber(saved[1])
local at, n, integral = now, 0, 0
if epoch then
  at, n, integral = tonumber(saved[2]), tonumber(saved[3]), tonumber(saved[4])
else
  epoch = now
end
if n > 0 and now > at then
  integral = integral + (now - at) / 1000 / n
end
if now > at then at = now end
local integral_text = string.format('%.17g', integral)
redis.call('HSET', state, 'epoch', epoch, 'at', at, 'n', inflight, 'i', integral_text)

local share = ''
if mode == 'end' and tonumber(ARGV[2]) == epoch then
  local charged = integral - tonumber(ARGV[3])
  if charged < 0 then charged = 0 end
  charged = charged * tonumber(ARGV[4])
  local eff_at = tonumber(saved[5]) or now
  local factor = 1
  if now > eff_at then factor = math.pow(0.5, (now - eff_at) / half_life) end
  local eff_gpu = (tonumber(saved[6]) or 0) * factor + charged
  local eff_tok = (tonumber(saved[7]) or 0) * factor + tonumber(ARGV[5])
  redis.call('HSET', state, 'eff_at', math.max(now, eff_at), 'eff_gpu', string.format('%.17g', eff_gpu),
    'eff_tok', string.format('%.17g', eff_tok))
  share = string.format('%.17g', charged)
end
redis.call('PEXPIRE', state, ttl)
return {epoch, integral_text, share, now}
