-- fixed_window: a counter per window; windows are aligned to the epoch. One string key holds
-- struct '<Id' (the window number modulo 2^32, the count) and expires at the end of its
-- window, plus a random spread of up to half the window (at most 5 minutes; see spread()).
-- A key that holds an earlier window counts as empty: the window number, not the expiry, says
-- which window a count belongs to (a script sees expiry as of the time it started; TIME is a
-- little later).
--
-- A module of decide.lua (check, settle, report, finish; see decide.lua):
-- it keeps each key's state by the key's index for the whole call, and writes each changed key
-- once.
-- (library functions as locals: a global lookup per use costs more)
local floor, ceil, max, min, format = math.floor, math.ceil, math.max, math.min, string.format
local random = math.random
local pack, unpack = struct.pack, struct.unpack
local WINDOWS = 4294967296  -- window numbers are kept modulo this ('I')
-- Counts saturate here (2^52): above any limit (at most 10^15) with any cost added, and exact
-- in doubles. Window ends are whole milliseconds below 2^53 (windows are at most 10^15 ms).
local MAX_COUNT = 4503599627370496

-- By key index: the key, its window number, the count, whether the stored value is of this
-- window (its expiry is right), the window's end (ms) and the wait until then (ms).
local key_of, window_of, used_of, current_of, end_of, reset_of = {}, {}, {}, {}, {}, {}
-- The expiry spread: each write that sets a key's expiry adds a random extra life of up to a
-- half the window (at most 5 minutes), drawn per key, so that the keys of many clients that
-- end together (windows are aligned to the epoch; a burst of new clients) do not all expire in
-- the same millisecond: Valkey's active expiry holds its main thread while it deletes them.
-- A key may outlive its window this way, never die before it, so no decision changes.
-- (math.random in a function: effects replication sends the writes, not the script.)
local function spread(window_ms)
  return random(0, max(0, min(5 * floor(window_ms / 10), 300000)))
end
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
    local current, used = false, 0
    if value and #value == 12 then
      local stored_n, count = unpack('<Id', value)
      if stored_n == n % WINDOWS then
        used, current = count, true
        if not (used >= 0) then used = 0 elseif used > MAX_COUNT then used = MAX_COUNT end
      end
    end
    key_of[k], window_of[k], used_of[k], current_of[k] = key, n, used, current
    -- (in ms: (n + 1) * window in us may pass 2^53 for the longest windows)
    end_of[k] = (n + 1) * p.window + spread(p.window)
    reset_of[k] = (n + 1) * p.window - floor(now_us / 1000)
  end
  return used_of[k] + p.cost <= p.limit
end

local function settle(k, p, allowed, charge)
  if not charge then return end
  if queued[k] ~= call then
    queued[k] = call
    changes = changes + 1
    changed[changes] = k
  end
  used_of[k] = min(used_of[k] + p.cost, MAX_COUNT)
end

local function report(k, p, allowed, out, pos)
  local reset = reset_of[k]
  out[pos + 1] = max(0, p.limit - used_of[k])
  out[pos + 2] = reset
  out[pos + 3] = allowed and 0 or reset  -- at least 1: the window has not ended
  return pos + 3
end

local function finish()
  for i = 1, changes do
    local k = changed[i]
    local value = pack('<Id', window_of[k] % WINDOWS, used_of[k])
    if current_of[k] then
      redis.call('SET', key_of[k], value, 'KEEPTTL')
    else
      redis.call('SET', key_of[k], value, 'PXAT', format('%d', end_of[k]))
    end
  end
end

-- Takes back `cost` counted at at_us: exact (counts add up), unless that window is over.
local function undo(key, limit, window_ms, cost, at_us, now_us)
  local value = redis.call('GET', key)
  if not value or #value ~= 12 then return 0 end
  local stored_n, count = unpack('<Id', value)
  if stored_n ~= floor(at_us / (window_ms * 1000)) % WINDOWS then return 0 end
  redis.call('SET', key, pack('<Id', stored_n, max(0, count - cost)), 'KEEPTTL')
  return 1
end

local M = {start = start, check = check, settle = settle, report = report, finish = finish,
           undo = undo}
return M
