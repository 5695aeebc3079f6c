-- token_bucket: capacity `burst`, refilled with `limit` tokens per `window`; tokens and the
-- time of the last update in a hash whose TTL is the time to refill fully plus a second.
--
-- Standalone (EVAL this file):
--   KEYS[1]  the hash (fields: tokens, ts)
--   ARGV[1]  limit          tokens added per window
--   ARGV[2]  window_ms
--   ARGV[3]  burst          capacity
--   ARGV[4]  cost           tokens this request takes
--   ARGV[5]  count_denied   "1": a refused request empties the bucket (a client that keeps
--                           hammering stays blocked)
--   ARGV[6]  request id     (unused here)
--   reply    {allowed (1|0), remaining (whole tokens), reset_ms (until full), retry_ms (until
--            `cost` tokens are there)}
local M = {}

function M.check(key, p, now_us)
  local rate = p.limit / (p.window * 1000)  -- tokens per microsecond
  local state = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens = tonumber(state[1]) or p.burst
  local ts = tonumber(state[2]) or now_us
  if now_us > ts then tokens = math.min(p.burst, tokens + (now_us - ts) * rate) end
  -- (every field in the constructor: a field added later resizes the table)
  return {key = key, rate = rate, now = now_us, tokens = tokens, allowed = tokens >= p.cost}
end

function M.settle(p, d, charge, id)
  if not charge then return end
  d.tokens = math.max(0, d.tokens - p.cost)
  redis.call('HSET', d.key, 'tokens', string.format('%.6f', d.tokens), 'ts', d.now)
  redis.call('PEXPIRE', d.key, math.ceil((p.burst - d.tokens) / d.rate / 1000) + 1000)
end

function M.report(p, d, out, pos)
  local retry = 0
  if not d.allowed then
    if p.cost > p.burst then
      retry = (p.burst / d.rate) + p.window * 1000
    else
      retry = (p.cost - d.tokens) / d.rate
    end
  end
  out[pos + 1] = math.floor(d.tokens)
  out[pos + 2] = math.ceil((p.burst - d.tokens) / d.rate / 1000)
  out[pos + 3] = d.allowed and 0 or math.max(1, math.ceil(retry / 1000))
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
