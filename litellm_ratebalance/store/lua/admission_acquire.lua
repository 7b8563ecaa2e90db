-- admission_acquire: apply pending settles of a model group and, unless only flushing, decide one request
-- and reserve it if admitted, atomically. Mirrors litellm_ratebalance.admission.ledger (settles, carry,
-- roll-over), .estimate (the learned output estimate) and .policy.decide (the decision); see their module
-- docstrings for the rules.
--
-- Clock: Redis server TIME (milliseconds), read only when deciding; the caller's clock is never used.
-- KEYS[1]  hash of the model group's current window. Fields: start (ms), r / t (model requests / tokens),
--          r:<pool> / t:<pool> (per pool), c (tokens carried from the previous window, included in t),
--          f (1: a request was refused for the model's tokens), g (the most of the headroom that requests
--          within their pool's share reserved), ps / pt / pl / pf / pg (previous window's start, final
--          tokens, tpm or -1, f, g). Restarted when now >= start + window.
-- KEYS[2]  hash of the model group's learned output estimate (same hash tag). Fields: c<b> / s<b> (count /
--          sum of the samples in bucket b), n / S (count / sum of all samples), e (the current estimate), h (the
--          headroom: tokens of the tpm new reservations leave free).
-- ARGV[1]  1: decide a request; 0: apply the settles only (ARGV[2], ARGV[3] and the limits are then unused)
-- ARGV[2]  fixed tokens of the request (counted before the call)
-- ARGV[3]  output cap: the request reserves min(cap, estimate) output tokens more; -1: none
-- ARGV[4]  the settings, space-separated (one string: the client builds it once per pool and settings):
--          window length (ms), model rpm (-1: none), model tpm (-1: none), saturation threshold (0..1),
--          pool field of the request, pool strict-mode request cap (-1: none), pool strict-mode token cap
--          (-1: none), prior (output tokens assumed before any sample), quantile of the estimate (0..1; -1: the mean),
--          window key time-to-live after the window ends (ms), estimate key time-to-live (ms, from the last
--          sample), samples at which the histogram halves, headroom weight, headroom cap (share of the
--          tpm), f (the number of floors), then f triples: other pool field, floor requests, floor tokens
-- ARGV[5]  settles, space-separated quadruples: window start (ms), pool field, token delta, request delta
-- ARGV[6]  samples, space-separated triples: bucket, count, sum of samples
-- Returns  when deciding: {admitted 0|1, reason 0..4, now_ms, window_start_ms, requests, tokens,
--          pool_requests, pool_tokens, saturation (string), strict 0|1, held_requests (string),
--          held_tokens (string), cost tokens, estimate (string, "" before any sample), headroom (string)};
--          counters are after the reservation when admitted, and the values decided on when refused.
--          When only applying settles: {1}.

local wkey, ekey = KEYS[1], KEYS[2]
local deciding = ARGV[1] == '1'
local fixed = tonumber(ARGV[2])
local output_cap = tonumber(ARGV[3])

local function words(text)
  local out = {}
  for word in string.gmatch(text, '%S+') do out[#out + 1] = word end
  return out
end

local h = words(ARGV[4])
local window = tonumber(h[1])
local rpm = tonumber(h[2])
local tpm = tonumber(h[3])
local threshold = tonumber(h[4])
local pool = h[5]
local pool_rpm = tonumber(h[6])
local pool_tpm = tonumber(h[7])
local prior = tonumber(h[8])
local quantile = tonumber(h[9])
local linger = tonumber(h[10])
local estimate_ttl = tonumber(h[11])
local decay_at = tonumber(h[12])
local headroom_weight = tonumber(h[13])
local headroom_cap = tonumber(h[14])
local n_floors = tonumber(h[15])
local settles = words(ARGV[5])
local samples = words(ARGV[6])

local function num(v) return tonumber(v) or 0 end

-- adds delta to an integer counter, never below zero
local function add(field, delta)
  if delta == 0 then return end
  local v = redis.call('HINCRBY', wkey, field, delta)
  if v < 0 then redis.call('HSET', wkey, field, 0) end
end

-- 1. settles, per window they were reserved in
local n_settles = #settles / 4
if n_settles > 0 then
  local cur = redis.call('HMGET', wkey, 'start', 'ps', 'pt', 'pl', 'c')
  local start = cur[1]
  if start then
    local prev_start, prev_tokens, prev_tpm, carry = cur[2], num(cur[3]), num(cur[4]), num(cur[5])
    local prev_moved = false
    for i = 0, n_settles - 1 do
      local base = 1 + i * 4
      local s, p = settles[base], settles[base + 1]
      local dt, dr = tonumber(settles[base + 2]), tonumber(settles[base + 3])
      if s == start then
        add('t', dt)
        add('t:' .. p, dt)
        add('r', dr)
        add('r:' .. p, dr)
      elseif s == prev_start then
        prev_tokens = prev_tokens + dt
        prev_moved = true
      elseif dt > 0 then
        add('t', dt)
      end
    end
    if prev_moved then
      local new_carry = 0
      if prev_tpm >= 0 then new_carry = math.max(0, prev_tokens - prev_tpm) end
      add('t', new_carry - carry)
      redis.call('HSET', wkey, 'pt', prev_tokens, 'c', new_carry)
    end
  end
end
-- samples: histogram, decay, estimate. n / S (count / sum of all samples) run along, so the mean needs
-- no pass over the buckets; that pass (HGETALL) happens only to decay them or for a quantile.
local n_buckets = #samples / 3
if n_buckets > 0 then
  local added_count, added_tokens = 0, 0
  for i = 0, n_buckets - 1 do
    local base = 1 + i * 3
    local b = samples[base]
    redis.call('HINCRBYFLOAT', ekey, 'c' .. b, samples[base + 1])
    redis.call('HINCRBYFLOAT', ekey, 's' .. b, samples[base + 2])
    added_count = added_count + tonumber(samples[base + 1])
    added_tokens = added_tokens + tonumber(samples[base + 2])
  end
  local running = redis.call('HMGET', ekey, 'n', 'S')
  local total = num(running[1]) + added_count
  local all_tokens = num(running[2]) + added_tokens
  local chosen = 0
  if total >= decay_at or quantile >= 0 or (running[1] and not running[2]) then
    local flat = redis.call('HGETALL', ekey)
    local counts, sums, buckets = {}, {}, {}
    for i = 1, #flat, 2 do
      local name, value = flat[i], flat[i + 1]
      local kind, b = string.sub(name, 1, 1), tonumber(string.sub(name, 2))
      if b and kind == 'c' then
        counts[b] = tonumber(value)
        buckets[#buckets + 1] = b
      elseif b and kind == 's' then
        sums[b] = tonumber(value)
      end
    end
    if total >= decay_at then
      total = total / 2
      for _, b in ipairs(buckets) do
        counts[b] = counts[b] / 2
        sums[b] = sums[b] / 2
        redis.call('HSET', ekey, 'c' .. b, string.format('%.17g', counts[b]), 's' .. b, string.format('%.17g', sums[b]))
      end
    end
    table.sort(buckets)
    total, all_tokens = 0, 0
    for _, b in ipairs(buckets) do
      total = total + counts[b]
      all_tokens = all_tokens + sums[b]
    end
    if quantile >= 0 then
      local target = quantile * total
      local cumulative = 0
      for _, b in ipairs(buckets) do
        if counts[b] > 0 then
          cumulative = cumulative + counts[b]
          chosen = sums[b] / counts[b]
          if cumulative >= target then break end
        end
      end
    end
  end
  if quantile < 0 and total > 0 then chosen = all_tokens / total end
  redis.call('HSET', ekey, 'n', string.format('%.17g', total), 'S', string.format('%.17g', all_tokens),
    'e', string.format('%.17g', chosen))
  redis.call('PEXPIRE', ekey, estimate_ttl)
end

if not deciding then
  return {1}
end

-- 2. roll over
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local start = tonumber(redis.call('HGET', wkey, 'start'))
if (not start) or now >= start + window then
  if start then
    local ended = redis.call('HMGET', wkey, 't', 'f', 'pt', 'pl', 'pf', 'g', 'pg')
    local ended_tokens = num(ended[1])
    local before_tpm = tonumber(ended[4]) or -1
    if ended[5] == '1' and before_tpm >= 0 then
      -- the window before the ended one was saturated and its corrections are in: learn the headroom,
      -- from what it ended above the limit it admitted against (the headroom within-share requests took
      -- included)
      local room = num(redis.call('HGET', ekey, 'h'))
      local overshoot = num(ended[3]) - (before_tpm - room + math.min(math.max(0, num(ended[7])), room))
      local moved = (1 - headroom_weight) * room + headroom_weight * overshoot
      room = math.min(math.max(0, moved), headroom_cap * before_tpm)
      redis.call('HSET', ekey, 'h', string.format('%.17g', room))
      redis.call('PEXPIRE', ekey, estimate_ttl)
    end
    local carry, prev_tpm = 0, -1
    if now < start + 2 * window and tpm >= 0 then
      carry = math.max(0, ended_tokens - tpm)
      prev_tpm = tpm
    end
    local full = 0
    if ended[2] == '1' then full = 1 end
    redis.call('DEL', wkey)
    redis.call('HSET', wkey, 'start', now, 'c', carry, 'ps', start, 'pt', ended_tokens, 'pl', prev_tpm,
      'pf', full, 'pg', ended[6] or 0)
    if carry > 0 then redis.call('HSET', wkey, 't', carry) end
  else
    redis.call('HSET', wkey, 'start', now)
  end
  start = now
end

-- 3. decide
local learned = redis.call('HMGET', ekey, 'e', 'h')
local estimate = learned[1]
local headroom = num(learned[2])
local cost = fixed
if output_cap >= 0 then
  local expected = prior
  if estimate then expected = tonumber(estimate) end
  cost = cost + math.min(output_cap, math.floor(expected + 0.5))
end

local vals = redis.call('HMGET', wkey, 'r', 't', 'r:' .. pool, 't:' .. pool)
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
  local base = 16 + i * 3
  local other = h[base]
  local fr, ft = tonumber(h[base + 1]), tonumber(h[base + 2])
  local ov = redis.call('HMGET', wkey, 'r:' .. other, 't:' .. other)
  held_r = held_r + math.max(0, fr - num(ov[1]))
  held_t = held_t + math.max(0, ft - num(ov[2]))
end

-- the headroom comes out of borrowing: a request that keeps its pool within its share need not leave it free
local within = pool_tpm >= 0 and fits(ptok, cost, pool_tpm)
local kept = headroom
if headroom <= 0 or within then kept = 0 end

local reason = 0
if rpm >= 0 and not fits(req, 1, rpm - held_r) then
  reason = 1
elseif tpm >= 0 and not fits(tok, cost, tpm - held_t - kept) then
  reason = 2
  redis.call('HSET', wkey, 'f', 1)
elseif strict and pool_rpm >= 0 and not fits(preq, 1, pool_rpm) then
  reason = 3
elseif strict and pool_tpm >= 0 and not fits(ptok, cost, pool_tpm) then
  reason = 4
end

if reason == 0 then
  req = redis.call('HINCRBY', wkey, 'r', 1)
  preq = redis.call('HINCRBY', wkey, 'r:' .. pool, 1)
  tok = redis.call('HINCRBY', wkey, 't', cost)
  ptok = redis.call('HINCRBY', wkey, 't:' .. pool, cost)
  if tpm >= 0 and headroom > 0 and within then
    -- the part of the headroom this reservation took (for learning the headroom): the window keeps the most
    local taken = math.min(headroom, math.max(0, tok - (tpm - held_t - headroom)))
    if taken > num(redis.call('HGET', wkey, 'g')) then
      redis.call('HSET', wkey, 'g', string.format('%.17g', taken))
    end
  end
end
redis.call('PEXPIREAT', wkey, start + window + linger)

return {reason == 0 and 1 or 0, reason, now, start, req, tok, preq, ptok, tostring(sat),
        strict and 1 or 0, tostring(held_r), tostring(held_t), cost, estimate or '',
        string.format('%.17g', headroom)}
