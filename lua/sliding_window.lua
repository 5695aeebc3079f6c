-- sliding_window: two fixed-window counters (this window and the one before); the estimate is
-- current + previous * (window - elapsed) / window. A counter lives two windows (it serves as
-- "previous" in the next one) and gets that TTL in the script that creates it.
--
-- Standalone (EVAL this file):
--   KEYS[1]  base key; the counters are KEYS[1]..":"..window number
--   ARGV[1]  limit          requests per window
--   ARGV[2]  window_ms
--   ARGV[3]  burst          (unused here)
--   ARGV[4]  cost
--   ARGV[5]  count_denied   "1": a refused request is counted too
--   ARGV[6]  request id     (unused here)
--   reply    {allowed (1|0), remaining, reset_ms, retry_ms}
--            retry_ms is exact: the estimate first lets this cost through after it, if nothing
--            else arrives meanwhile.
local M = {}

function M.check(key, p, now_us)
  local window = p.window * 1000
  local n = math.floor(now_us / window)
  local current_key = key .. ':' .. n
  local elapsed = now_us - n * window
  local current = tonumber(redis.call('GET', current_key) or '0')
  local previous = tonumber(redis.call('GET', key .. ':' .. (n - 1)) or '0')
  local weight = (window - elapsed) / window
  -- (every field in the constructor: a field added later resizes the table)
  return {key = current_key, window = window, n = n, elapsed = elapsed, current = current,
          previous = previous, weight = weight,
          allowed = current + previous * weight + p.cost <= p.limit}
end

function M.settle(p, d, charge, id)
  if not charge then return end
  d.current = redis.call('INCRBY', d.key, p.cost)
  -- The increment that created the counter gives it its TTL, in the same atomic script.
  if d.current == p.cost then
    redis.call('PEXPIREAT', d.key, math.ceil((d.n + 2) * d.window / 1000))
  end
end

-- Microseconds until current + previous * weight + cost <= limit, nothing else arriving.
local function wait_us(p, d)
  local left = d.window - d.elapsed
  if d.current + p.cost <= p.limit then
    if d.previous <= 0 then return 0 end
    -- Still in this window: the previous window's share decays linearly.
    return math.max(0, left - (p.limit - p.cost - d.current) * d.window / d.previous)
  end
  -- Only in the next window, where this window's count decays in turn.
  if p.cost > p.limit then return left + d.window end
  return left + math.max(0, d.window * (1 - (p.limit - p.cost) / d.current))
end

function M.report(p, d, out, pos)
  local estimate = d.current + d.previous * d.weight
  local left = d.window - d.elapsed
  local reset = 0
  if d.current > 0 then reset = left + d.window elseif d.previous > 0 then reset = left end
  local retry = 0
  if not d.allowed then retry = math.ceil(wait_us(p, d) / 1000) end
  out[pos + 1] = math.max(0, math.floor(p.limit - estimate))
  out[pos + 2] = math.ceil(reset / 1000)
  out[pos + 3] = d.allowed and 0 or math.max(1, retry)
  return pos + 3
end

if KEYS == nil then return M end
local t = redis.call('TIME')
local p = {limit = tonumber(ARGV[1]), window = tonumber(ARGV[2]), burst = tonumber(ARGV[3]),
           cost = tonumber(ARGV[4]), count_denied = ARGV[5] == '1'}
local d = M.check(KEYS[1], p, tonumber(t[1]) * 1000000 + tonumber(t[2]))
M.settle(p, d, d.allowed or p.count_denied, ARGV[6] or '')
local out = {d.allowed and 1 or 0}
M.report(p, d, out, 1)
return out
