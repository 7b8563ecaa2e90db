-- admission_acquire: decide one request and, if admitted, reserve it, atomically.
-- Mirrors litellm_ratebalance.admission.policy.decide (see its module docstring for the rules).
--
-- Clock: Redis server TIME (milliseconds); the caller's clock is never used.
-- KEYS[1]  hash of the model group's current window. Fields: start (ms), r / t (model requests /
--          tokens), r:<pool> / t:<pool> (per pool). Rolled over (deleted and restarted) when
--          now >= start + window.
-- ARGV[1]  window length, ms
-- ARGV[2]  model rpm, or -1 when not configured
-- ARGV[3]  model tpm, or -1 when not configured
-- ARGV[4]  saturation threshold (0..1)
-- ARGV[5]  pool field of this request
-- ARGV[6]  pool strict-mode request cap, or -1 for none
-- ARGV[7]  pool strict-mode token cap, or -1 for none
-- ARGV[8]  tokens to reserve (estimate of the request's cost)
-- ARGV[9]  key time-to-live after the window ends, ms
-- ARGV[10] n, the number of floors that follow
-- ARGV[11..] n triples: other pool field, floor requests, floor tokens
-- Returns  {admitted 0|1, reason 0..4, now_ms, window_start_ms, requests, tokens, pool_requests,
--           pool_tokens, saturation (string), strict 0|1, held_requests (string), held_tokens (string)}
--          counters are after the reservation when admitted, and the values decided on when refused.

local key = KEYS[1]
local window = tonumber(ARGV[1])
local rpm = tonumber(ARGV[2])
local tpm = tonumber(ARGV[3])
local threshold = tonumber(ARGV[4])
local pool = ARGV[5]
local pool_rpm = tonumber(ARGV[6])
local pool_tpm = tonumber(ARGV[7])
local cost = tonumber(ARGV[8])
local linger = tonumber(ARGV[9])
local n_floors = tonumber(ARGV[10])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local start = tonumber(redis.call('HGET', key, 'start'))
if (not start) or now >= start + window then
  redis.call('DEL', key)
  start = now
  redis.call('HSET', key, 'start', start)
end

local function num(v) return tonumber(v) or 0 end
local vals = redis.call('HMGET', key, 'r', 't', 'r:' .. pool, 't:' .. pool)
local req, tok, preq, ptok = num(vals[1]), num(vals[2]), num(vals[3]), num(vals[4])

local function fits(used, need, limit)
  if limit <= 0 then return false end
  return used + math.min(need, limit) <= limit
end

local sat = 0
if rpm > 0 then sat = math.max(sat, req / rpm) end
if tpm > 0 then sat = math.max(sat, tok / tpm) end
local strict = sat >= threshold

local held_r, held_t = 0, 0
for i = 0, n_floors - 1 do
  local base = 11 + i * 3
  local other = ARGV[base]
  local fr, ft = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])
  local ov = redis.call('HMGET', key, 'r:' .. other, 't:' .. other)
  held_r = held_r + math.max(0, fr - num(ov[1]))
  held_t = held_t + math.max(0, ft - num(ov[2]))
end

local reason = 0
if rpm >= 0 and not fits(req, 1, rpm - held_r) then
  reason = 1
elseif tpm >= 0 and not fits(tok, cost, tpm - held_t) then
  reason = 2
elseif strict and pool_rpm >= 0 and not fits(preq, 1, pool_rpm) then
  reason = 3
elseif strict and pool_tpm >= 0 and not fits(ptok, cost, pool_tpm) then
  reason = 4
end

if reason == 0 then
  req = redis.call('HINCRBY', key, 'r', 1)
  preq = redis.call('HINCRBY', key, 'r:' .. pool, 1)
  tok = redis.call('HINCRBY', key, 't', cost)
  ptok = redis.call('HINCRBY', key, 't:' .. pool, cost)
end
redis.call('PEXPIREAT', key, start + window + linger)

return {reason == 0 and 1 or 0, reason, now, start, req, tok, preq, ptok, tostring(sat),
        strict and 1 or 0, tostring(held_r), tostring(held_t)}
