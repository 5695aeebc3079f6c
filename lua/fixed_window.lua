-- fixed_window: a counter per window; windows are aligned to the epoch and the window number
-- is part of the key, so a new window is a new key. The counter gets its TTL (the end of its
-- window) in the same script that creates it, so it never exists without one.
--
-- Standalone (EVAL this file):
--   KEYS[1]  base key, e.g. "rl:v1:per_ip:203.0.113.7"; the script uses KEYS[1]..":"..window
--   ARGV[1]  limit          requests per window
--   ARGV[2]  window_ms
--   ARGV[3]  burst          (unused here)
--   ARGV[4]  cost           what this request costs
--   ARGV[5]  count_denied   "1": a refused request is counted too
--   ARGV[6]  request id     (unused here)
--   reply    {allowed (1|0), remaining, reset_ms, retry_ms}
-- Inside decide.lua the same code is a module (check, settle, report, many, finish; see
-- decide.lua).
-- A script call may decide many requests, several of them on one counter: the first one
-- charges it in Valkey at once (INCRBY, which also says what it holds), the next ones only in
-- the script's memory, and finish() writes the difference back with one more INCRBY. The
-- script is atomic, so nobody sees the counter in between, and each request still sees what
-- the ones before it charged. Requests alike (many()) are charged all at once, and taken back
-- for the ones that must not count.
-- The window of `window_ms` that holds now_us: its key suffix, end and the wait until then.
-- The time is one instant for a whole script, so each window is worked out once per call.
local windows = {}
local function window_of(window_ms, now_us)
  local window = window_ms * 1000
  local n = math.floor(now_us / window)
  local w = {suffix = ':' .. string.format('%d', n), end_ms = (n + 1) * window_ms,
             reset = math.ceil(((n + 1) * window - now_us) / 1000)}
  windows[window_ms] = w
  return w
end

-- The counters this call touched, by key: `used` is the count as the script sees it, `stored`
-- what Valkey holds. The last check() of a counter also leaves there what report() reads.
local counters = {}
local changed = {}  -- keys whose `used` may differ from `stored`

-- A counter this call has not touched yet (`key` with its window's suffix), charged `amount`
-- in Valkey at once: INCRBY also says what it holds, and the increment that created it gives
-- it its TTL, in the same atomic script. After that it is counted in memory (count()), and
-- finish() writes the difference back.
local function charged(key, w, amount)
  local used = redis.call('INCRBY', key, amount)
  if used == amount then redis.call('PEXPIREAT', key, w.end_ms) end
  -- (every field in the constructor: a field added later resizes the table)
  local c = {key = key, w = w, used = used, stored = used, allowed = true, changed = false}
  counters[key] = c
  return c
end

-- The counter holds `used` as the script sees it.
local function count(c, used)
  c.used = used
  if used ~= c.stored and not c.changed then
    c.changed = true
    changed[#changed + 1] = c
  end
end

local function check(key, p, now_us)
  local w = windows[p.window] or window_of(p.window, now_us)
  key = key .. w.suffix
  local c = counters[key]
  if c == nil then
    c = charged(key, w, p.cost)
  else
    count(c, c.used + p.cost)
  end
  c.allowed = c.used <= p.limit
  return c
end

-- Not to be counted: the charge is taken back (in memory; finish() writes it).
local function settle(p, d, charge)
  if not charge then count(d, d.used - p.cost) end
end

local function report(p, d, out, pos)
  out[pos + 1] = math.max(0, p.limit - d.used)
  out[pos + 2] = d.w.reset
  out[pos + 3] = d.allowed and 0 or d.w.reset  -- at least 1: the window has not ended
  return pos + 3
end

-- `n` requests alike (this limit alone, the same key and cost), decided in one step exactly as
-- n requests one after the other would be: the first `fit` are allowed and charged; the others
-- are refused, and charged only when the limit counts denied requests. Writes their reply as
-- runs after out[pos] (see decide.lua) and returns the new end.
local function many(key, p, now_us, n, out, pos)
  local cost, limit = p.cost, p.limit
  -- All n charged at once (one INCRBY when the counter is new to this call); count() takes
  -- back what must not count.
  local w = windows[p.window] or window_of(p.window, now_us)
  key = key .. w.suffix
  local c = counters[key]
  local before
  if c == nil then
    c = charged(key, w, n * cost)
    before = c.used - n * cost
  else
    before = c.used
  end
  local fit
  if cost > 0 then
    fit = math.floor((limit - before) / cost)
  else
    fit = before <= limit and n or 0
  end
  if fit < 0 then fit = 0 elseif fit > n then fit = n end
  count(c, before + (p.count_denied and n or fit) * cost)
  c.allowed = fit == n
  local reset = c.w.reset
  if fit > 0 then  -- request j of these: remaining limit - before - j * cost
    out[pos + 1], out[pos + 2], out[pos + 3], out[pos + 4] = fit, limit - before - cost, reset, 0
    out[pos + 5], out[pos + 6], out[pos + 7] = -cost, 0, 0
    pos = pos + 7
  end
  if fit < n then  -- what report() says of each refused one: they all see the same counter
    local remaining = p.count_denied and 0 or limit - before - fit * cost
    if remaining < 0 then remaining = 0 end
    out[pos + 1], out[pos + 2], out[pos + 3], out[pos + 4] = n - fit, remaining, reset, reset
    out[pos + 5], out[pos + 6], out[pos + 7] = 0, 0, 0
    pos = pos + 7
  end
  return pos
end

-- Writes back what the script counted; a counter that ends at 0 (only requests that were not
-- counted touched it) is not left behind.
local function finish()
  for i = 1, #changed do
    local c = changed[i]
    if c.used ~= c.stored then
      c.stored = redis.call('INCRBY', c.key, c.used - c.stored)
    end
    if c.stored == 0 then redis.call('DEL', c.key) end
  end
end

local M = {check = check, settle = settle, report = report, many = many, finish = finish}
if KEYS == nil then return M end
local t = redis.call('TIME')
local p = {limit = tonumber(ARGV[1]), window = tonumber(ARGV[2]), burst = tonumber(ARGV[3]),
           cost = tonumber(ARGV[4]), count_denied = ARGV[5] == '1'}
local d = M.check(KEYS[1], p, tonumber(t[1]) * 1000000 + tonumber(t[2]))
M.settle(p, d, d.allowed or p.count_denied, ARGV[6] or '')
M.finish()
local out = {d.allowed and 1 or 0}
M.report(p, d, out, 1)
return out
