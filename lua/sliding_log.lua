-- sliding_log: a sorted set of request times (score: microseconds, member: unique per request
-- and unit of cost). Expired entries are trimmed, the rest counted; the key's TTL is one window
-- after its newest entry. Memory is bounded: accepted requests never exceed the limit, and
-- with count_denied the set is trimmed to its newest `keep` entries (the largest limit of the
-- quotas that share the key: a plan's and the limit's own), so a key never holds more than
-- that, even while a client keeps hammering. Trimming to the refused request's own limit
-- would erase what a larger quota on the same key still counts; `keep` entries are all that
-- any of them reads (a quota of L refuses at L entries and waits for the (L - cost + 1)th
-- newest to expire).
--
-- Standalone (EVAL this file):
--   KEYS[1]  the sorted set
--   ARGV[1]  limit          requests per window
--   ARGV[2]  window_ms
--   ARGV[3]  burst          (unused here)
--   ARGV[4]  cost
--   ARGV[5]  count_denied   "1": a refused request is recorded too (it stays blocked while it
--                           keeps hammering)
--   ARGV[6]  request id     makes members unique across gateways
--   ARGV[7]  keep           optional (default limit): the largest limit sharing the key
--   reply    {allowed (1|0), remaining, reset_ms, retry_ms}
local M = {}

function M.check(key, p, now_us)
  local window = p.window * 1000
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now_us - window)
  local count = redis.call('ZCARD', key)
  -- (every field in the constructor: a field added later resizes the table)
  return {key = key, window = window, now = now_us, count = count,
          allowed = count + p.cost <= p.limit}
end

function M.settle(p, d, charge, id)
  if not charge then return end
  for i = 1, p.cost do
    redis.call('ZADD', d.key, d.now, d.now .. ':' .. id .. ':' .. i)
  end
  if not d.allowed then
    redis.call('ZREMRANGEBYRANK', d.key, 0, -(math.max(p.keep, p.limit) + 1))
  end
  d.count = redis.call('ZCARD', d.key)
  redis.call('PEXPIRE', d.key, p.window)
end

-- Microseconds until entry number `rank` (0 = oldest) leaves the window.
local function expiry_of(d, rank)
  local entry = redis.call('ZRANGE', d.key, rank, rank, 'WITHSCORES')
  if entry[2] == nil then return 0 end
  return math.max(0, tonumber(entry[2]) + d.window - d.now)
end

function M.report(p, d, out, pos)
  local reset = 0
  if d.count > 0 then reset = expiry_of(d, d.count - 1) end
  local retry = 0
  if not d.allowed then
    if p.cost > p.limit then
      retry = reset + d.window
    else
      retry = expiry_of(d, d.count + p.cost - p.limit - 1)
    end
  end
  out[pos + 1] = math.max(0, p.limit - d.count)
  out[pos + 2] = math.ceil(reset / 1000)
  out[pos + 3] = d.allowed and 0 or math.max(1, math.ceil(retry / 1000))
  return pos + 3
end

if KEYS == nil then return M end
local t = redis.call('TIME')
local p = {limit = tonumber(ARGV[1]), window = tonumber(ARGV[2]), burst = tonumber(ARGV[3]),
           cost = tonumber(ARGV[4]), count_denied = ARGV[5] == '1',
           keep = tonumber(ARGV[7] or ARGV[1])}
local d = M.check(KEYS[1], p, tonumber(t[1]) * 1000000 + tonumber(t[2]))
M.settle(p, d, d.allowed or p.count_denied, ARGV[6] or '')
local out = {d.allowed and 1 or 0}
M.report(p, d, out, 1)
return out
