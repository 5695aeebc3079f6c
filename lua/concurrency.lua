-- concurrency: at most `limit` requests of a key in flight at once, across every gateway. The
-- key is a sorted set of slots: each member is the name of one request's slot (a lease, unique
-- per request, chosen by its gateway), scored with the server time (microseconds) at which its
-- lease ends. A request takes a slot when fewer than `limit` live ones are held; its gateway
-- renews the lease while the request lasts and frees the slot when it ends (the lease
-- function of decide.lua). A slot whose lease ended (its gateway died, or could not renew)
-- counts as free: each call first drops them. The key expires a lease after the last take or
-- renewal (plus a random spread of up to half the lease, at most 5 minutes: slots whose
-- lease ended count as free whatever the key's expiry), so a key whose gateways all died goes
-- away by itself.
--
-- A module of decide.lua (check, settle, report, finish, undo, lease; see
-- decide.lua); its window_ms is the lease, and the request's slot name comes with the call.
-- (library functions as locals: a global lookup per use costs more)
local max, format, type = math.max, string.format, type
local floor, min, random = math.floor, math.min, math.random

-- The expiry spread (ms; as in fixed_window.lua): a random extra life of up to half the
-- window (at most 5 minutes), drawn per key, so that keys written together do not all expire
-- in the same millisecond. A key may outlive its window this way, never die before it.
local function spread(window_ms)
  return random(0, max(0, min(5 * floor(window_ms / 10), 300000)))
end

-- By key index: the key, the live slots, whether it held another type (replaced when written),
-- the lease (ms) and the slot names this call takes.
local key_of, count_of, wrong_of, lease_of, taken_of = {}, {}, {}, {}, {}
-- The call (a number) that first met each key index: state of another call is stale.
local seen, queued = {}, {}
local changed, changes, call = {}, 0, 0
local now  -- the call's time (us)

local function start()
  call = call + 1
  changes = 0
end

-- A reply of redis.pcall that is an error (a key of another type).
local function failed(result) return type(result) == 'table' and result.err ~= nil end

-- Whether the slot `slot` of key index k is held: live in the key, or taken earlier in this
-- call.
local function held(k, key, slot)
  if queued[k] == call then
    for _, name in ipairs(taken_of[k]) do
      if name == slot then return true end
    end
  end
  if wrong_of[k] then return false end
  return redis.call('ZSCORE', key, slot) ~= false
end

local function check(k, key, value, p, now_us, slot)
  if seen[k] ~= call then
    seen[k] = call
    now = now_us
    local count, wrong = 0, false
    if failed(redis.pcall('ZREMRANGEBYSCORE', key, '-inf', format('%d', now_us))) then
      wrong = true
    else
      count = redis.call('ZCARD', key)
    end
    key_of[k], count_of[k], wrong_of[k] = key, count, wrong
  end
  -- A slot is one request's: a name already held is refused (a second take of it would hold
  -- nothing more and count nothing).
  if slot and held(k, key, slot) then return false end
  return count_of[k] + p.cost <= p.limit
end

local function settle(k, p, allowed, charge, slot)
  if not charge or not allowed or not slot then return end
  count_of[k] = count_of[k] + p.cost
  if queued[k] ~= call then
    queued[k] = call
    changes = changes + 1
    changed[changes] = k
    taken_of[k] = {}
    lease_of[k] = p.window
  end
  local taken = taken_of[k]
  taken[#taken + 1] = slot
  lease_of[k] = max(lease_of[k], p.window)
end

local function report(k, p, allowed, out, pos)
  local free = max(0, p.limit - count_of[k])
  out[pos + 1] = free
  out[pos + 2] = free > 0 and 0 or 1000  -- no time frees a slot: a second is the advice
  out[pos + 3] = allowed and 0 or 1000
  return pos + 3
end

-- Keeps the key a lease past its last take (never shorter than it was: another gateway's
-- lease may be longer).
local function extend(key, lease_ms)
  if redis.call('PTTL', key) < lease_ms then
    redis.call('PEXPIRE', key, format('%d', lease_ms + spread(lease_ms)))
  end
end

local function finish()
  for i = 1, changes do
    local k = changed[i]
    local key, lease = key_of[k], lease_of[k]
    if wrong_of[k] then redis.call('DEL', key) end
    local ends = format('%d', now + lease * 1000)
    local args = {}
    for j, slot in ipairs(taken_of[k]) do
      args[2 * j - 1], args[2 * j] = ends, slot
    end
    redis.call('ZADD', key, unpack(args))
    extend(key, lease)
  end
end

-- Frees the slot named `slot` (taken by a call whose request another slot of the cluster
-- refused).
local function undo(key, limit, window_ms, cost, slot, now_us)
  local removed = redis.pcall('ZREM', key, slot)
  if failed(removed) then return 0 end
  return removed
end

-- renew: a slot still held is held for lease_ms from now; one whose lease ended is freed (it
-- may already count as free). release: frees it. Returns 1 if the slot was held.
local function lease(op, key, slot, lease_ms, now_us)
  if op == 'release' then return undo(key, 0, 0, 1, slot, now_us) end
  local ends = redis.pcall('ZSCORE', key, slot)
  if failed(ends) or not ends then return 0 end
  if ends + 0 <= now_us then
    redis.call('ZREM', key, slot)
    return 0
  end
  redis.call('ZADD', key, 'XX', format('%d', now_us + lease_ms * 1000), slot)
  extend(key, lease_ms)
  return 1
end

local M = {start = start, check = check, settle = settle, report = report, finish = finish,
           undo = undo, lease = lease}
return M
