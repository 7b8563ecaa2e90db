-- contract_settle: reconcile counted requests of one window after their calls: their token estimates
-- leave the in-flight fields and their actual usage is recorded, per feature and in the basket.
-- Mirrors litellm_ratebalance.contracts.policy.ContractLedger.settle_many.
--
-- Clock: none needed; the window is named by the key (its start, as contract_admit returned it).
-- KEYS[1]  TPM hash of the window the requests were counted in (see contract_admit.lua)
-- ARGV     one triple per feature, at least one: ARGV[3i-2] feature field (escaped name; never
--          "__basket__"), ARGV[3i-1] estimates to release from its in-flight field, tokens (0 if
--          already released), ARGV[3i] actual tokens to record, tokens. The basket takes the sums.
-- Returns  {applied 0|1, basket_tokens, tokens of the first feature, of the second, ...}: recorded + in
--          flight after the reconcile; {0, 0} when the key has expired (a late reconcile never
--          re-creates a key without a TTL).
-- In-flight fields never go below zero (so one release of a sum ends where several releases would).

local key = KEYS[1]
if redis.call('EXISTS', key) == 0 then
  return {0, 0}
end

local function settle(name, release, actual)
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

local features = {}
local released, recorded = 0, 0
for i = 1, #ARGV, 3 do
  local release = math.max(0, tonumber(ARGV[i + 1]))
  local actual = math.max(0, tonumber(ARGV[i + 2]))
  features[#features + 1] = settle(ARGV[i], release, actual)
  released, recorded = released + release, recorded + actual
end
local reply = {1, settle('__basket__', released, recorded)}
for _, tokens in ipairs(features) do
  reply[#reply + 1] = tokens
end
return reply
