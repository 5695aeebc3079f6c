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
-- Inside decide.lua the same code is a module: check() charges the cost at once (one INCRBY;
-- the common case, an allowed request, needs nothing more), settle() takes it back when the
-- request must not be counted, report() renders the reply. The script is atomic, so nobody
-- sees a charge that is taken back.
local M = {}

-- The window of `window_ms` that holds now_us: its key suffix, end and the wait until then.
-- The time is one instant for a whole script, so each window is worked out once per call.
local windows = {}
local function window_of(window_ms, now_us)
  local w = windows[window_ms]
  if w == nil then
    local window = window_ms * 1000
    local n = math.floor(now_us / window)
    w = {suffix = ':' .. string.format('%d', n), end_ms = (n + 1) * window_ms,
         reset = math.ceil(((n + 1) * window - now_us) / 1000)}
    windows[window_ms] = w
  end
  return w
end

function M.check(key, p, now_us)
  local w = window_of(p.window, now_us)
  local d = {key = key .. w.suffix, w = w}
  d.used = redis.call('INCRBY', d.key, p.cost)
  -- The increment that created the counter gives it its TTL, in the same atomic script.
  if d.used == p.cost then redis.call('PEXPIREAT', d.key, w.end_ms) end
  d.allowed = d.used <= p.limit
  return d
end

function M.settle(p, d, charge)
  if charge then return end
  d.used = redis.call('DECRBY', d.key, p.cost)
  -- A counter that only this request made is not left behind.
  if d.used == 0 then redis.call('DEL', d.key) end
end

function M.report(p, d, out, pos)
  out[pos + 1] = d.allowed and 1 or 0
  out[pos + 2] = math.max(0, p.limit - d.used)
  out[pos + 3] = d.w.reset
  out[pos + 4] = d.allowed and 0 or d.w.reset
  return pos + 4
end

if KEYS == nil then return M end
local t = redis.call('TIME')
local p = {limit = tonumber(ARGV[1]), window = tonumber(ARGV[2]), burst = tonumber(ARGV[3]),
           cost = tonumber(ARGV[4]), count_denied = ARGV[5] == '1'}
local d = M.check(KEYS[1], p, tonumber(t[1]) * 1000000 + tonumber(t[2]))
M.settle(p, d, d.allowed or p.count_denied, ARGV[6] or '')
local out = {}
M.report(p, d, out, 0)
return out
