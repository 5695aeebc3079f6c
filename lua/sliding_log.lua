-- sliding_log: the times of the requests in the last window (server microseconds), oldest
-- first, one 8-byte little-endian double each, in one string key that expires one window after
-- its newest entry (plus a random spread of up to half the window, at most 5 minutes).
-- An entry older than the window no longer counts and is dropped the next time the key is
-- written. A request of `cost` adds `cost` entries (at most keep + 1: added() below). Memory
-- is bounded: accepted requests never exceed the limit, and with count_denied a refused
-- request (or a charge forced into debt) keeps the newest `keep` + `cost` entries (keep: the largest limit of the quotas that share the key, a plan's and the limit's
-- own), so a key never holds more than that, even while a client keeps hammering. Trimming to
-- the refused request's own limit would erase what a larger quota on the same key still
-- counts; `keep` entries are all that any of them reads (a quota of L refuses at L entries and
-- waits for the (L - cost + 1)th newest to expire). The `cost` more are those the request's
-- own entries would push out: a take-back (a shadow limit's record of a request refused in
-- another cluster slot) removes its entries and leaves the newest `keep` as they were before
-- it.
--
-- A module of decide.lua (check, settle, report, finish; see decide.lua):
-- it keeps each key's log by the key's index for the whole call, and writes each changed key
-- once.
-- (library functions as locals: a global lookup per use costs more)
local floor, ceil, max, rep, sub = math.floor, math.ceil, math.max, string.rep, string.sub
local format, min, random = string.format, math.min, math.random
local pack, unpack = struct.pack, struct.unpack
local ENTRY = 8
-- A key's log never grows past MAX_LOG_BYTES (64 MiB, 8 Mi entries; the configuration keeps a
-- sliding_log's limit at most 1,000,000, whose log is at most 2,000,001 entries): a request
-- whose charge would make it longer fails alone, before anything is charged.
local MAX_LOG_BYTES = 67108864

-- The expiry spread (ms; as in fixed_window.lua): a random extra life of up to half the
-- window (at most 5 minutes), drawn per key, so that keys written together do not all expire
-- in the same millisecond. A key may outlive its window this way, never die before it.
local function spread(window_ms)
  return random(0, max(0, min(5 * floor(window_ms / 10), 300000)))
end

-- By key index: the key, its live entries, how many, the window (us).
local key_of, log_of, count_of, window_of = {}, {}, {}, {}
-- The call (a number) that first met each key index: state of another call is stale. The
-- tables live as long as the library, so a call reuses them instead of building new ones.
local seen, queued = {}, {}  -- by key index: the call that read it, that queued it
local changed, changes, call = {}, 0, 0  -- key indices to write, in order; the call

local function start()
  call = call + 1
  changes = 0
end
local now  -- the call's time (us)

-- The entries a charge adds: its cost, but never more than the largest limit on the key + 1.
-- As many entries of one time refuse every quota on the key (each is at most that limit) until
-- they leave the window, as a larger cost would (a cost reported by a response can be 10^15),
-- and a request waits for the same entry; so no decision changes.
local function added(p)
  return min(p.cost, max(p.keep or p.limit, p.limit) + 1)
end

-- Entry i (from 1, the oldest) of a log.
local function entry(log, i)
  return (unpack('<d', log, (i - 1) * ENTRY + 1))
end

local function check(k, key, value, p, now_us)
  if seen[k] ~= call then
    seen[k] = call
    now = now_us
    local window = p.window * 1000
    local log = value or ''
    local n = floor(#log / ENTRY)
    local first, cutoff = 1, now_us - window
    while first <= n and entry(log, first) <= cutoff do first = first + 1 end
    if first > 1 then log = sub(log, (first - 1) * ENTRY + 1, n * ENTRY) end
    local count = n - first + 1
    key_of[k], log_of[k], count_of[k], window_of[k] = key, log, count, window
  end
  local add = added(p)
  if add > 0 and #log_of[k] + add * ENTRY > MAX_LOG_BYTES then
    error(format('sliding_log: a charge of %.14g would make its key longer than %d bytes',
                 p.cost, MAX_LOG_BYTES))
  end
  return count_of[k] + p.cost <= p.limit
end

local function settle(k, p, allowed, charge)
  if not charge then return end
  local add = added(p)
  local log, count = log_of[k] .. rep(pack('<d', now), add), count_of[k] + add
  -- (an allowed charge never passes keep; a forced one, into debt, may: the newest keep + add
  -- entries are all that any quota on the key reads, as for a refusal)
  local keep = max(p.keep or p.limit, p.limit) + add
  if count > keep then
    log, count = sub(log, -keep * ENTRY), keep
  end
  log_of[k], count_of[k] = log, count
  if queued[k] ~= call then
    queued[k] = call
    changes = changes + 1
    changed[changes] = k
  end
end

-- Microseconds until entry i (from 1, the oldest) of key index k leaves the window.
local function expiry_of(k, i)
  if i < 1 or i > count_of[k] then return 0 end
  return max(0, entry(log_of[k], i) + window_of[k] - now)
end

local function report(k, p, allowed, out, pos)
  local count = count_of[k]
  local reset = expiry_of(k, count)
  local retry = 0
  if not allowed then
    if p.cost > p.limit then
      retry = reset + window_of[k]
    else
      retry = expiry_of(k, count + p.cost - p.limit)
    end
  end
  out[pos + 1] = max(0, p.limit - count)
  out[pos + 2] = ceil(reset / 1000)
  out[pos + 3] = allowed and 0 or max(1, ceil(retry / 1000))
  return pos + 3
end

local function finish()
  for i = 1, changes do
    local k = changed[i]
    local window_ms = ceil(window_of[k] / 1000)
    redis.call('SET', key_of[k], log_of[k], 'PX', format('%d', window_ms + spread(window_ms)))
  end
end

-- Takes back the `cost` entries of time at_us (one call's entries all have its time, and any
-- of them will do); the key goes when nothing is left.
local function undo(key, limit, window_ms, cost, at_us, now_us)
  local log = redis.call('GET', key)
  if not log then return 0 end
  local n = floor(#log / ENTRY)
  local kept, removed = {}, 0
  for i = 1, n do
    local t = entry(log, i)
    if removed < cost and t == at_us then
      removed = removed + 1
    else
      kept[#kept + 1] = sub(log, (i - 1) * ENTRY + 1, i * ENTRY)
    end
  end
  if removed == 0 then return 0 end
  if #kept == 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, table.concat(kept), 'KEEPTTL')
  end
  return 1
end

local M = {start = start, check = check, settle = settle, report = report, finish = finish,
           undo = undo}
return M
