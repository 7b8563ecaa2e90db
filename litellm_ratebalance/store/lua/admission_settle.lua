-- admission_settle: correct a reservation after the call (reconcile to actual usage, or release).
--
-- Clock: none needed; the window is identified by its start time as returned by admission_acquire.
-- KEYS[1]  hash of the model group's current window (see admission_acquire.lua)
-- ARGV[1]  window start (ms) the reservation was made in
-- ARGV[2]  pool field of the request
-- ARGV[3]  token delta: actual - reserved (negative to give back)
-- ARGV[4]  request delta (0 normally; -1 to give the request back)
-- Returns  1 if applied; 0 if that window has already ended (its counters are gone and the usage is
--          attributed to the window the request was admitted in, so nothing is carried over).
-- Counters never go below zero.

local key = KEYS[1]
local start = redis.call('HGET', key, 'start')
if (not start) or start ~= ARGV[1] then
  return 0
end
local pool = ARGV[2]
local dt = tonumber(ARGV[3])
local dr = tonumber(ARGV[4])

local function add(field, delta)
  if delta == 0 then return end
  local v = redis.call('HINCRBY', key, field, delta)
  if v < 0 then redis.call('HSET', key, field, 0) end
end

add('t', dt)
add('t:' .. pool, dt)
add('r', dr)
add('r:' .. pool, dr)
return 1
