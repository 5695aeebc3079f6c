-- token_bucket: capacity `burst`, refilled with `limit` tokens per `window`, kept as GCRA does:
-- one string key holding the theoretical arrival time TAT (microseconds, server time). A token
-- is `window / limit` of time (T); the bucket is empty by (TAT - now) / T tokens and full when
-- TAT <= now. A request of `cost` fits when max(TAT, now) + cost * T - now <= burst * T; it
-- moves TAT there. The key expires at TAT, when the bucket is full again.
--
-- Quotas that share a key (a plan's and the limit's own, for one client with and without its
-- API key) share TAT: time refills every one of them alike, each request moves TAT by its own
-- T per token, and each admits only while TAT stays within its own burst. So every quota
-- admits at most burst + elapsed / T, whatever the others do, and the key expires when the
-- bucket is full for all of them. (With tokens and a refill rate per quota, one quota's faster
-- refill would hand another tokens it never had.)
--
-- Standalone (EVAL this file):
--   KEYS[1]  the key (a string: TAT)
--   ARGV[1]  limit          tokens added per window
--   ARGV[2]  window_ms
--   ARGV[3]  burst          capacity
--   ARGV[4]  cost           tokens this request takes
--   ARGV[5]  count_denied   "1": a refused request empties the bucket (a client that keeps
--                           hammering stays blocked)
--   ARGV[6]  request id     (unused here)
--   reply    {allowed (1|0), remaining (whole tokens), reset_ms (until full), retry_ms (until
--            `cost` tokens are there)}
-- A call may decide several requests on one bucket: it reads the key once, keeps how far
-- behind the bucket is (TAT - now, exact to a fraction of a microsecond) in memory, and
-- finish() writes TAT once, rounded up to a whole microsecond (never a token more).
local buckets = {}  -- by key, what this call knows: {key, now, debt, changed}
local changed = {}

-- TAT of a key, or nil. A bucket of the earlier layout (a hash of tokens and ts) is read as
-- the TAT it stands for, and the next charge replaces it.
local function stored_tat(key, p, token_us)
  local value = redis.pcall('GET', key)
  if type(value) == 'table' and value.err then
    local state = redis.call('HMGET', key, 'tokens', 'ts')
    local tokens, ts = tonumber(state[1]), tonumber(state[2])
    if tokens == nil or ts == nil then return nil end
    return ts + math.max(0, p.burst - tokens) * token_us
  end
  return value and value + 0
end

-- Float sums of `window / limit` are exact to far below a microsecond; this absorbs their
-- rounding, so that `burst` requests at one instant all fit.
local SLACK_US = 1e-6

local function check(key, p, now_us)
  local token_us = p.window * 1000 / p.limit
  local b = buckets[key]
  if b == nil then
    local tat = stored_tat(key, p, token_us)
    b = {key = key, now = now_us, debt = 0, changed = false}
    if tat and tat > now_us then b.debt = tat - now_us end
    buckets[key] = b
  end
  local burst_us = p.burst * token_us
  local after = b.debt + p.cost * token_us
  -- (every field in the constructor: a field added later resizes the table)
  return {b = b, token_us = token_us, burst_us = burst_us, debt = b.debt, after = after,
          allowed = after <= burst_us + SLACK_US}
end

local function settle(p, d, charge)
  if not charge then return end
  local debt = d.after
  -- A refused request that counts empties the bucket (it never refills it).
  if not d.allowed then debt = math.max(d.debt, d.burst_us) end
  local b = d.b
  b.debt = debt
  if not b.changed then
    b.changed = true
    changed[#changed + 1] = b
  end
  d.debt = debt
  d.after = debt + p.cost * d.token_us
end

local function report(p, d, out, pos)
  local retry = 0
  if not d.allowed then
    if p.cost > p.burst then
      retry = d.debt + p.window * 1000
    else
      retry = d.after - d.burst_us
    end
  end
  out[pos + 1] = math.max(0, math.floor((d.burst_us - d.debt) / d.token_us + 1e-9))
  out[pos + 2] = math.ceil(d.debt / 1000 - 1e-9)
  out[pos + 3] = d.allowed and 0 or math.max(1, math.ceil(retry / 1000 - 1e-9))
  return pos + 3
end

-- Writes TAT of every bucket this call charged; its TTL ends when the bucket is full again.
local function finish()
  for i = 1, #changed do
    local b = changed[i]
    if b.debt > SLACK_US then
      local tat = math.ceil(b.now + b.debt - SLACK_US)
      redis.call('SET', b.key, string.format('%d', tat), 'PX', math.ceil((tat - b.now) / 1000))
    end
  end
end

local M = {check = check, settle = settle, report = report, finish = finish}
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
