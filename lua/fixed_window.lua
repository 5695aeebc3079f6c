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
-- Inside decide.lua the same code is a module: check() reads, commit() charges, report()
-- renders the reply.
local M = {}

function M.check(key, p, now_us)
  local window = p.window * 1000
  local n = math.floor(now_us / window)
  local d = {key = key .. ':' .. n, window_end = (n + 1) * window, now = now_us}
  d.used = tonumber(redis.call('GET', d.key) or '0')
  d.allowed = d.used + p.cost <= p.limit
  return d
end

function M.commit(p, d)
  d.used = redis.call('INCRBY', d.key, p.cost)
  -- The increment that created the counter gives it its TTL, in the same atomic script.
  if d.used == p.cost then redis.call('PEXPIREAT', d.key, math.ceil(d.window_end / 1000)) end
end

function M.report(p, d)
  local reset = math.ceil((d.window_end - d.now) / 1000)
  local retry = 0
  if not d.allowed then retry = reset end
  return {d.allowed and 1 or 0, math.max(0, p.limit - d.used), reset, retry}
end

if KEYS == nil then return M end
local t = redis.call('TIME')
local p = {limit = tonumber(ARGV[1]), window = tonumber(ARGV[2]), burst = tonumber(ARGV[3]),
           cost = tonumber(ARGV[4]), count_denied = ARGV[5] == '1', id = ARGV[6] or ''}
local d = M.check(KEYS[1], p, tonumber(t[1]) * 1000000 + tonumber(t[2]))
if d.allowed or p.count_denied then M.commit(p, d) end
return M.report(p, d)
