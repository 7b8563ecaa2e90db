-- _sharing: the cost mark that concurrency_acquire and concurrency_release carry (included in them by the
-- loader at its "--#include _sharing" line; never run alone). The estimator: litellm_ratebalance/attribution/
-- sharing.py; the embedded store's copy: litellm_ratebalance/store/metering.py (MemorySharing).
--
-- sharing_mark(state, inflight, now, margs)
--   state    hash of the deployment's cost state: epoch (ms), at (ms of the last mark), n (in flight since
--            then), i (the integral, seconds), eff_at (ms), eff_gpu (decayed GPU-seconds), eff_tok (decayed
--            output tokens)
--   inflight requests in flight from now on (the leases alive after the caller's change)
--   now      Redis server TIME of the caller, ms
--   margs    {"start"|"end", start epoch ms, start integral (s), GPUs, output tokens >= 0, half-life ms > 0,
--            time-to-live of the state ms > 0}; the middle four are read only for "end"
-- Returns {epoch ms, integral after the mark (string), share (string, GPU-seconds; "" for a start mark or
-- when the start mark belongs to another epoch)}. The interval since the last mark is divided by the count
-- recorded then (every change of the count comes with a mark); an idle interval adds nothing. A missing state
-- starts a new epoch at now.
local function sharing_mark(state, inflight, now, margs)
  local half_life = tonumber(margs[6])
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
  if margs[1] == 'end' and tonumber(margs[2]) == epoch then
    local charged = integral - tonumber(margs[3])
    if charged < 0 then charged = 0 end
    charged = charged * tonumber(margs[4])
    local eff_at = tonumber(saved[5]) or now
    local factor = 1
    if now > eff_at then factor = math.pow(0.5, (now - eff_at) / half_life) end
    local eff_gpu = (tonumber(saved[6]) or 0) * factor + charged
    local eff_tok = (tonumber(saved[7]) or 0) * factor + tonumber(margs[5])
    redis.call('HSET', state, 'eff_at', math.max(now, eff_at), 'eff_gpu', string.format('%.17g', eff_gpu),
      'eff_tok', string.format('%.17g', eff_tok))
    share = string.format('%.17g', charged)
  end
  redis.call('PEXPIRE', state, tonumber(margs[7]))
  return {epoch, integral_text, share}
end
