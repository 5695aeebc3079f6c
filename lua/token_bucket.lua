-- token_bucket: capacity `burst`, refilled with `limit` tokens per `window`, kept as GCRA does:
-- one string key holding the theoretical arrival time TAT (microseconds, server time). A token
-- is `window / limit` of time (T); the bucket is empty by (TAT - now) / T tokens and full when
-- TAT <= now. A request of `cost` fits when max(TAT, now) + cost * T - now <= burst * T; it
-- moves TAT there. The key expires at TAT, when the bucket is full again, plus a random spread
-- of up to half the window (at most 5 minutes): a TAT that has passed reads as a full
-- bucket, so the spread changes no decision.
--
-- Quotas that share a key (a plan's and the limit's own, for one client with and without its
-- API key) share TAT: time refills every one of them alike, each request moves TAT by its own
-- T per token, and each admits only while TAT stays within its own burst. So every quota
-- admits at most burst + elapsed / T, whatever the others do, and the key expires when the
-- bucket is full for all of them. (With tokens and a refill rate per quota, one quota's faster
-- refill would hand another tokens it never had.)
--
-- A module of decide.lua (check, settle, report, finish; see decide.lua):
-- it keeps each bucket by the key's index for the whole call, as how far behind it is
-- (TAT - now, exact to a fraction of a microsecond), and writes TAT once, rounded up to a
-- whole microsecond (never a token more).
-- (library functions as locals: a global lookup per use costs more)
local floor, ceil, max, min, format = math.floor, math.ceil, math.max, math.min, string.format
local random = math.random

-- The ceiling of a bucket's debt (TAT - now) and of every wait it reports: 2^31 - 1 seconds
-- (68 years; what a Retry-After is sure to be read as). A charge beyond it (a huge cost from a
-- response) saturates there, and a bucket whose burst takes longer than that to refill admits
-- only while its debt stays below it (never more than its quota). TAT stays below
-- now + MAX_DEBT_US, far below 2^53 us, where doubles stop being exact, until the year 2187.
local MAX_DEBT_US = 2147483647e6

-- The rounding of float sums of `window / limit` is absorbed, so that `burst` requests at one
-- instant all fit: a microsecond, and 2^-40 of the bucket, since a sum's rounding grows with
-- it (a day's bucket is 8.64e10 us, where one step of a double is 1.5e-5 us: seven tokens of a
-- 7-per-day bucket added one by one came a step above 7 * T). Both far below a token (burst *
-- 2^-40 of one, burst < 2^32): never a token more.
local SLACK_US = 1e-6
local SLACK_OF_BUCKET = 1 / 1099511627776

-- The expiry spread (ms; as in fixed_window.lua): a random extra life of up to half the
-- window (at most 5 minutes), drawn per key, so that keys written together do not all expire
-- in the same millisecond. A key may outlive its window this way, never die before it.
local function spread(window_ms)
  return random(0, max(0, min(5 * floor(window_ms / 10), 300000)))
end

local key_of, debt_of, window_of = {}, {}, {}  -- by key index: the key, TAT - now (us), window
-- The call (a number) that first met each key index: state of another call is stale. The
-- tables live as long as the library, so a call reuses them instead of building new ones.
local seen, queued = {}, {}  -- by key index: the call that read it, that queued it
local changed, changes, call = {}, 0, 0  -- key indices to write, in order; the call
-- The debt (us) the last settle added, which report writes as a 4th value for a limit that is a
-- shadow and counts denied requests (its refusal's take-back restores exactly that: below).
local added = 0

local function start()
  call = call + 1
  changes = 0
end
local now  -- the call's time (us)

local function check(k, key, value, p, now_us)
  if seen[k] ~= call then
    local debt = 0
    if value then
      local tat = value + 0  -- (not a number: this request's error, and the key is not seen)
      if tat > now_us then debt = min(tat - now_us, MAX_DEBT_US) end
    end
    seen[k] = call
    now = now_us
    key_of[k], debt_of[k], window_of[k] = key, debt, p.window
  end
  local debt = debt_of[k]
  local token_us = p.window * 1000 / p.limit
  local bucket = min(p.burst * token_us, MAX_DEBT_US)
  return debt + p.cost * token_us <= bucket + bucket * SLACK_OF_BUCKET + SLACK_US
end

local function settle(k, p, allowed, charge)
  added = 0
  if not charge then return end
  local token_us = p.window * 1000 / p.limit
  local before = debt_of[k]
  if allowed then
    debt_of[k] = min(before + p.cost * token_us, MAX_DEBT_US)
  else  -- a refused request that counts empties the bucket (it never refills it)
    debt_of[k] = max(before, min(p.burst * token_us, MAX_DEBT_US))
  end
  added = debt_of[k] - before
  if queued[k] ~= call then
    queued[k] = call
    changes = changes + 1
    changed[changes] = k
  end
end

local function report(k, p, allowed, out, pos)
  local token_us = p.window * 1000 / p.limit
  local debt = debt_of[k]
  local retry = 0
  if not allowed then
    if p.cost > p.burst then
      retry = debt + p.window * 1000
    else
      retry = debt + (p.cost - p.burst) * token_us
    end
  end
  out[pos + 1] = max(0, floor(p.burst - debt / token_us + 1e-9))
  out[pos + 2] = ceil(debt / 1000 - 1e-9)
  out[pos + 3] = allowed and 0 or max(1, ceil(min(retry, MAX_DEBT_US) / 1000 - 1e-9))
  if p.shadow and p.count_denied then  -- what a take-back of this request gives back
    out[pos + 4] = floor(added)
    return pos + 4
  end
  return pos + 3
end

-- Writes TAT of every bucket this call charged; its TTL ends when the bucket is full again.
local function finish()
  for i = 1, changes do
    local k = changed[i]
    local debt = debt_of[k]
    if debt > SLACK_US then
      local tat = ceil(now + debt - SLACK_US)  -- debt <= MAX_DEBT_US: a whole number < 2^53
      -- A debt below what a double resolves at now (a huge limit per a short window) is
      -- still a debt: a microsecond, rounded up as every TAT is (never a token more), so the
      -- key's life is at least a millisecond (SET refuses PX 0, which would fail the call).
      if tat <= now then tat = now + 1 end
      redis.call('SET', key_of[k], format('%d', tat), 'PX',
                 format('%d', ceil((tat - now) / 1000) + spread(window_of[k])))
    end
  end
end

-- Takes back `cost` tokens taken at at_us (or, given debt_us, that debt: what the decide reply
-- said the charge added, which for a refusal that emptied the bucket is not the cost), less
-- the refill time that passed since: while the charge stood, another request may have found
-- the bucket fuller than it would have been without it (TAT moved from its time, not from the
-- earlier TAT), which the key cannot tell, and TAT - back + (now - at) is never below what TAT
-- would be without the charge. So a take-back never lets the bucket admit more than it would
-- have; the key goes when the bucket is full again.
local function undo(key, limit, window_ms, cost, at_us, now_us, debt_us)
  local value = redis.call('GET', key)
  if not value then return 0 end
  local tat = value + 0
  local back = (debt_us or cost * window_ms * 1000 / limit) - max(0, now_us - at_us)
  if not (back > 0) then return 0 end
  tat = ceil(min(tat, now_us + MAX_DEBT_US) - back)
  if not (tat > now_us) then
    redis.call('DEL', key)
  else
    redis.call('SET', key, format('%d', tat), 'PX',
               format('%d', ceil((tat - now_us) / 1000) + spread(window_ms)))
  end
  return 1
end

local M = {start = start, check = check, settle = settle, report = report, finish = finish,
           undo = undo}
return M
