-- sliding_window: the counts of this window and the one before (windows aligned to the epoch);
-- the estimate is current + previous * (window - elapsed) / window. One string key holds
-- struct '<Idd' (the window number modulo 2^32, the current count, the previous count) and
-- expires at the end of the next window, where its current count still weighs as previous,
-- plus a random spread of up to half the window (at most 5 minutes), so that the keys of
-- many clients do not all expire in the same millisecond (Valkey stalls while it deletes them).
-- What a key holds for an older window is read as what it means now: its current count
-- becomes previous one window later, and nothing after that.
--
-- A module of decide.lua (check, settle, report, finish; see decide.lua):
-- it keeps each key's state by the key's index for the whole call, and writes each changed key
-- once.
-- (library functions as locals: a global lookup per use costs more)
local floor, ceil, max, min, format = math.floor, math.ceil, math.max, math.min, string.format
local pack, unpack = struct.pack, struct.unpack
local random = math.random
local WINDOWS = 4294967296  -- window numbers are kept modulo this ('I')
-- Counts saturate here (2^52): above any limit (at most 10^15) with any cost added, and exact
-- in doubles. Expiry times are whole milliseconds below 2^53 (windows are at most 10^15 ms).
local MAX_COUNT = 4503599627370496
-- The expiry spread (ms; as in fixed_window.lua): a random extra life of up to half the
-- window (at most 5 minutes), drawn per key, so that keys written together do not all expire
-- in the same millisecond. A key may outlive its window this way, never die before it.
local function spread(window_ms)
  return random(0, max(0, min(5 * floor(window_ms / 10), 300000)))
end
local function count_of(v)
  if not (v >= 0) then return 0 end
  return min(v, MAX_COUNT)
end

-- By key index: the key, the window number, its length and how much of it has passed (us),
-- the current and previous counts, whether the stored value is of this window (its expiry is
-- right).
local key_of, window_of, length_of, elapsed_of, expiry_of = {}, {}, {}, {}, {}
local current_of, previous_of, same_of = {}, {}, {}
-- The call (a number) that first met each key index: state of another call is stale. The
-- tables live as long as the library, so a call reuses them instead of building new ones.
local seen, queued = {}, {}  -- by key index: the call that read it, that queued it
local changed, changes, call = {}, 0, 0  -- key indices to write, in order; the call

local function start()
  call = call + 1
  changes = 0
end

local function check(k, key, value, p, now_us)
  if seen[k] ~= call then
    seen[k] = call
    local window = p.window * 1000
    local n = floor(now_us / window)
    local current, previous, same = 0, 0, false
    if value and #value == 20 then
      local stored_n, stored_current, stored_previous = unpack('<Idd', value)
      if stored_n == n % WINDOWS then
        current, previous, same = count_of(stored_current), count_of(stored_previous), true
      elseif stored_n == (n - 1) % WINDOWS then
        previous = count_of(stored_current)
      end
    end
    key_of[k], window_of[k], length_of[k], elapsed_of[k] = key, n, window, now_us - n * window
    expiry_of[k] = (n + 2) * p.window + spread(p.window)
    current_of[k], previous_of[k], same_of[k] = current, previous, same
  end
  local window = length_of[k]
  return current_of[k] + previous_of[k] * (window - elapsed_of[k]) / window + p.cost <= p.limit
end

local function settle(k, p, allowed, charge)
  if not charge then return end
  if queued[k] ~= call then
    queued[k] = call
    changes = changes + 1
    changed[changes] = k
  end
  current_of[k] = min(current_of[k] + p.cost, MAX_COUNT)
end

-- Microseconds until current + previous * weight + cost <= limit, nothing else arriving.
local function wait_us(k, p)
  local window, current, previous = length_of[k], current_of[k], previous_of[k]
  local left = window - elapsed_of[k]
  if current + p.cost <= p.limit then
    if previous <= 0 then return 0 end
    -- Still in this window: the previous window's share decays linearly.
    return max(0, left - (p.limit - p.cost - current) * window / previous)
  end
  -- Only in the next window, where this window's count decays in turn.
  if p.cost > p.limit then return left + window end
  return left + max(0, window * (1 - (p.limit - p.cost) / current))
end

local function report(k, p, allowed, out, pos)
  local window, current, previous = length_of[k], current_of[k], previous_of[k]
  local left = window - elapsed_of[k]
  local reset = 0
  if current > 0 then reset = left + window elseif previous > 0 then reset = left end
  out[pos + 1] = max(0, floor(p.limit - current - previous * left / window))
  out[pos + 2] = ceil(reset / 1000)
  out[pos + 3] = allowed and 0 or max(1, ceil(wait_us(k, p) / 1000))
  return pos + 3
end

local function finish()
  for i = 1, changes do
    local k = changed[i]
    local n = window_of[k]
    local value = pack('<Idd', n % WINDOWS, current_of[k], previous_of[k])
    if same_of[k] then
      redis.call('SET', key_of[k], value, 'KEEPTTL')
    else
      redis.call('SET', key_of[k], value, 'PXAT', format('%d', expiry_of[k]))
    end
  end
end

-- Takes back `cost` counted at at_us: from the current count while that window lasts, from the
-- previous one in the window after; exact (counts add up).
local function undo(key, limit, window_ms, cost, at_us, now_us)
  local value = redis.call('GET', key)
  if not value or #value ~= 20 then return 0 end
  local stored_n, current, previous = unpack('<Idd', value)
  local n = floor(at_us / (window_ms * 1000))
  if stored_n == n % WINDOWS then
    current = max(0, current - cost)
  elseif stored_n == (n + 1) % WINDOWS then
    previous = max(0, previous - cost)
  else
    return 0
  end
  redis.call('SET', key, pack('<Idd', stored_n, current, previous), 'KEEPTTL')
  return 1
end

local M = {start = start, check = check, settle = settle, report = report, finish = finish,
           undo = undo}
return M
