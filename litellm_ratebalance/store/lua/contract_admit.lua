-- contract_admit: classify one request against its feature's and the basket's traffic contract in the
-- current fixed window and, unless the action for its mode is reject, count it, atomically.
-- Mirrors litellm_ratebalance.contracts.policy.ContractLedger.admit (see that module's docstring).
--
-- Clock: Redis server TIME; window start = floor(now_s / window) * window. The caller builds the keys
-- for the window it expects (the hash tag is the window start, so both keys share one cluster slot);
-- if that is not the current window, nothing is written and the current start is returned.
-- KEYS[1]  RPM hash of the window: fields <feature>, __basket__ = requests counted
-- KEYS[2]  TPM hash of the window: fields <feature>, __basket__ = tokens recorded by reconciled
--          requests; <feature>:inflight, __basket__:inflight = estimates of requests in flight
-- ARGV[1]  window start the keys were built for, s since the epoch
-- ARGV[2]  window length, s
-- ARGV[3]  counter lifetime, s from the window start (> window length); keys EXPIREAT start + ttl
-- ARGV[4]  feature field (escaped name; never "__basket__")
-- ARGV[5]  feature rpm contract, -1 = none
-- ARGV[6]  feature tpm contract, -1 = none
-- ARGV[7]  basket rpm contract, -1 = none
-- ARGV[8]  basket tpm contract, -1 = none
-- ARGV[9]  this request's token estimate, tokens
-- ARGV[10] 1 if a request whose worst mode is borrowed is rejected (then not counted), else 0
-- ARGV[11] 1 if a request whose worst mode is degraded is rejected (then not counted), else 0
-- Returns  {1, now_ms, window_start, rpm_mode, tpm_mode, counted 0|1, feature_requests,
--           basket_requests, feature_tokens, basket_tokens}
--          modes: 0 normal, 1 borrowed, 2 degraded; tokens = recorded + in flight; counts include this
--          request when counted, and are the values decided on otherwise.
--          {0, now_ms, window_start} when KEYS are not the current window's (nothing written).

local t = redis.call('TIME')
local now_s = tonumber(t[1])
local now_ms = now_s * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[2])
local start = math.floor(now_s / window) * window
if start ~= tonumber(ARGV[1]) then
  return {0, now_ms, start}
end

local rpm_key, tpm_key = KEYS[1], KEYS[2]
local ttl = tonumber(ARGV[3])
local feature = ARGV[4]
local f_rpm, f_tpm = tonumber(ARGV[5]), tonumber(ARGV[6])
local b_rpm, b_tpm = tonumber(ARGV[7]), tonumber(ARGV[8])
local estimate = math.max(0, tonumber(ARGV[9]))
local reject_borrowed, reject_degraded = ARGV[10] == '1', ARGV[11] == '1'
local basket = '__basket__'
local f_inflight, b_inflight = feature .. ':inflight', basket .. ':inflight'

local function num(v) return tonumber(v) or 0 end

-- true if `need` more would exceed `limit` given `used`; a request never has to fit more than the
-- whole limit (oversize rule); a negative limit means no contract.
local function over(used, need, limit)
  if limit < 0 then return false end
  if limit == 0 then return true end
  return used + math.min(need, limit) > limit
end

local function classify(f_used, b_used, need, f_lim, b_lim)
  if over(b_used, need, b_lim) then return 2 end
  if over(f_used, need, f_lim) then return 1 end
  return 0
end

local r = redis.call('HMGET', rpm_key, feature, basket)
local f_req, b_req = num(r[1]), num(r[2])
local k = redis.call('HMGET', tpm_key, feature, f_inflight, basket, b_inflight)
local f_tok, b_tok = num(k[1]) + num(k[2]), num(k[3]) + num(k[4])

local rpm_mode = classify(f_req, b_req, 1, f_rpm, b_rpm)
local tpm_mode = classify(f_tok, b_tok, estimate, f_tpm, b_tpm)
local worst = math.max(rpm_mode, tpm_mode)
local counted = not ((worst == 1 and reject_borrowed) or (worst == 2 and reject_degraded))

if counted then
  f_req = redis.call('HINCRBY', rpm_key, feature, 1)
  b_req = redis.call('HINCRBY', rpm_key, basket, 1)
  redis.call('HINCRBY', tpm_key, f_inflight, estimate)
  redis.call('HINCRBY', tpm_key, b_inflight, estimate)
  f_tok, b_tok = f_tok + estimate, b_tok + estimate
  redis.call('EXPIREAT', rpm_key, start + ttl)
  redis.call('EXPIREAT', tpm_key, start + ttl)
end

return {1, now_ms, start, rpm_mode, tpm_mode, counted and 1 or 0, f_req, b_req, f_tok, b_tok}
