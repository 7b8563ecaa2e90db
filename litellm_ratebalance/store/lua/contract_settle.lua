-- contract_settle: reconcile one counted request after the call: its token estimate leaves the
-- in-flight fields and its actual usage is recorded, in the window it was counted in.
-- Mirrors litellm_ratebalance.contracts.policy.ContractLedger.settle.
--
-- Clock: none needed; the window is named by the key (its start, as contract_admit returned it).
-- KEYS[1]  TPM hash of the window the request was counted in (see contract_admit.lua)
-- ARGV[1]  feature field (escaped name)
-- ARGV[2]  estimate to release from the in-flight fields, tokens (0 if already released)
-- ARGV[3]  actual tokens to record, tokens
-- Returns  {applied 0|1, feature_tokens, basket_tokens}: recorded + in flight after the reconcile;
--          {0, 0, 0} when the key has expired (a late reconcile never re-creates a key without a TTL).
-- In-flight fields never go below zero.

local key = KEYS[1]
if redis.call('EXISTS', key) == 0 then
  return {0, 0, 0}
end
local feature = ARGV[1]
local release = math.max(0, tonumber(ARGV[2]))
local actual = math.max(0, tonumber(ARGV[3]))
local basket = '__basket__'

local function settle(name)
  local inflight = name .. ':inflight'
  if release > 0 then
    local left = redis.call('HINCRBY', key, inflight, -release)
    if left < 0 then redis.call('HSET', key, inflight, 0) end
  end
  if actual > 0 then
    redis.call('HINCRBY', key, name, actual)
  end
  local v = redis.call('HMGET', key, name, inflight)
  return (tonumber(v[1]) or 0) + math.max(0, tonumber(v[2]) or 0)
end

local f_tok = settle(feature)
local b_tok = settle(basket)
return {1, f_tok, b_tok}
