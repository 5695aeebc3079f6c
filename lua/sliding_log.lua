-- sliding_log: the times of the requests in the last window (server microseconds, whole
-- numbers), oldest first, one element each, in a list key that expires one window after its
-- newest entry (plus a random spread of up to half the window, at most 5 minutes).
-- An entry older than the window no longer counts and is trimmed the next time the key is
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
-- What a decision costs does not grow with the log: it reads the entries that left the window
-- (LRANGE from the head, in chunks that double), the one or two entries its reply names
-- (LINDEX), and writes what it trims (LTRIM), adds (RPUSH) and the expiry, never the whole log. A list,
-- which decide.lua's MGET reads as absent, so that nothing copies it either.
--
-- A module of decide.lua (check, settle, report, finish; see decide.lua):
-- it keeps each key's state by the key's index for the whole call (a name at several indices
-- shares its first index's state), and writes each changed key once.
-- (library functions as locals: a global lookup per use costs more)
local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min
local format, random, tonumber, unpack = string.format, math.random, tonumber, unpack
-- A key's log never grows past MAX_LOG_ENTRIES (the configuration keeps a sliding_log's limit
-- at most 1,000,000, whose log is at most 2,000,001 entries): a request whose charge would
-- make it longer fails alone, before anything is charged.
local MAX_LOG_ENTRIES = 8388608

-- An entry's time (an element that is not a number, which only another writer of the key can
-- have put there, is 0: long out of the window).
local function time_of(element)
  return tonumber(element) or 0
end
-- The entries one RPUSH sends at most (a large cost adds up to keep + 1 of them).
local PUSH_BATCH = 1000

-- The expiry spread (ms; as in fixed_window.lua): a random extra life of up to half the
-- window (at most 5 minutes), drawn per key, so that keys written together do not all expire
-- in the same millisecond. A key may outlive its window this way, never die before it.
local function spread(window_ms)
  return random(0, max(0, min(5 * floor(window_ms / 10), 300000)))
end

-- By key index: the key, the stored list's length, how many of its oldest entries go (out of
-- the window, or trimmed), how many entries of the call's time come after it, how many count
-- (the stored ones left + those), the window (us).
local key_of, stored_of, drop_of, add_of, count_of, window_of = {}, {}, {}, {}, {}, {}
local wrong_of = {}  -- by key index: it holds another type (read as absent, replaced)
-- The call (a number) that first met each key index: state of another call is stale. The
-- tables live as long as the library, so a call reuses them instead of building new ones.
local seen, queued = {}, {}  -- by key index: the call that read it, that queued it
-- By key name: its first index in the call (the names of the call, forgotten by the next).
local index_of, names, nnames = {}, {}, 0
local changed, changes, call = {}, 0, 0  -- key indices to write, in order; the call

local function start()
  call = call + 1
  changes = 0
  for i = 1, nnames do index_of[names[i]] = nil end
  nnames = 0
end
local now  -- the call's time (us)

-- The entries a charge adds: its cost, but never more than the largest limit on the key + 1.
-- As many entries of one time refuse every quota on the key (each is at most that limit) until
-- they leave the window, as a larger cost would (a cost reported by a response can be 10^15),
-- and a request waits for the same entry; so no decision changes.
local function added(p)
  return min(p.cost, max(p.keep or p.limit, p.limit) + 1)
end

-- How many entries at the head of the list left the window (time <= cutoff): they are the
-- oldest, so read in chunks from the head, each twice the last, until one is still in it.
local function expired(key, n, cutoff)
  local first, step = 0, 16
  while first < n do
    local chunk = redis.call('LRANGE', key, first, first + step - 1)
    local j, m = 1, #chunk
    while j <= m and time_of(chunk[j]) <= cutoff do j = j + 1 end
    first = first + j - 1
    if j <= m or m == 0 then break end
    step = step * 2
  end
  return first
end

-- The index whose state key index k shares (a name met at an earlier index of the call).
local function canonical(k, key)
  local first = index_of[key]
  if first then return first end
  index_of[key] = k
  nnames = nnames + 1
  names[nnames] = key
  return k
end

local alias = {}  -- by key index: the index holding its state in this call

local function check(k, key, value, p, now_us)
  if seen[k] ~= call then
    seen[k] = call
    local c = canonical(k, key)
    alias[k] = c
    if c == k then
      now = now_us
      local window = p.window * 1000
      local n = redis.pcall('LLEN', key)
      local wrong = type(n) ~= 'number'
      if wrong then n = 0 end
      local first = expired(key, n, now_us - window)
      key_of[k], stored_of[k], drop_of[k], add_of[k] = key, n, first, 0
      count_of[k], window_of[k], wrong_of[k] = n - first, window, wrong
    end
  end
  k = alias[k]
  local add = added(p)
  if add > 0 and count_of[k] + add > MAX_LOG_ENTRIES then
    error(format('sliding_log: a charge of %.14g would make its log longer than %d entries',
                 p.cost, MAX_LOG_ENTRIES))
  end
  return count_of[k] + p.cost <= p.limit
end

local function settle(k, p, allowed, charge)
  if not charge then return end
  k = alias[k]
  local add = added(p)
  local count = count_of[k] + add
  add_of[k] = add_of[k] + add
  -- (an allowed charge never passes keep; a forced one, into debt, may: the newest keep + add
  -- entries are all that any quota on the key reads, as for a refusal)
  local keep = max(p.keep or p.limit, p.limit) + add
  if count > keep then
    -- the oldest go: the stored ones left first, then the call's own
    local cut, left = count - keep, stored_of[k] - drop_of[k]
    if cut <= left then
      drop_of[k] = drop_of[k] + cut
    else
      drop_of[k] = stored_of[k]
      add_of[k] = add_of[k] - (cut - left)
    end
    count = keep
  end
  count_of[k] = count
  if queued[k] ~= call then
    queued[k] = call
    changes = changes + 1
    changed[changes] = k
  end
end

-- Microseconds until entry i (from 1, the oldest that counts) of key index k leaves the window.
local function expiry_of(k, i)
  if i < 1 or i > count_of[k] then return 0 end
  local at = drop_of[k] + i - 1  -- its index in the stored list, or past it: the call's time
  local t = now
  if at < stored_of[k] then t = time_of(redis.call('LINDEX', key_of[k], at)) end
  return max(0, t + window_of[k] - now)
end

local function report(k, p, allowed, out, pos)
  k = alias[k]
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

-- A reply of redis.pcall that is an error (a key of another type).
local function failed(r)
  return type(r) == 'table' and r.err ~= nil
end

local push_args = {}  -- (the RPUSH arguments, reused from call to call)

local function finish()
  for i = 1, changes do
    local k = changed[i]
    local key, drop = key_of[k], drop_of[k]
    if wrong_of[k] or (drop > 0 and drop >= stored_of[k]) then
      redis.call('DEL', key)
    elseif drop > 0 and failed(redis.pcall('LTRIM', key, drop, -1)) then
      redis.call('DEL', key)  -- written meanwhile by another algorithm's limit on the key
    end
    -- the call's entries, PUSH_BATCH at a time
    local add = add_of[k]
    if add > 0 then
      local t = format('%d', now)
      local n = min(add, PUSH_BATCH)
      for j = 1, n do push_args[j] = t end
      if failed(redis.pcall('RPUSH', key, unpack(push_args, 1, n))) then
        redis.call('DEL', key)  -- (as above)
        redis.call('RPUSH', key, unpack(push_args, 1, n))
      end
      add = add - n
      while add > 0 do
        n = min(add, PUSH_BATCH)
        redis.call('RPUSH', key, unpack(push_args, 1, n))
        add = add - n
      end
    end
    local window_ms = ceil(window_of[k] / 1000)
    redis.call('PEXPIRE', key, format('%d', window_ms + spread(window_ms)))
  end
end

-- Takes back `cost` entries of time at_us (one call's entries all have its time, and any of
-- them will do); the key goes when nothing is left. Entries are in time order, so those of
-- at_us are among the newest: read back from the tail, in chunks that double, to the first
-- older one, and only that tail is rewritten.
local function undo(key, limit, window_ms, cost, at_us, now_us)
  local n = redis.call('LLEN', key)  -- (another type: the call's error, as GET's was)
  if n == 0 then return 0 end
  local from, step = n, 16  -- the tail from `from` holds no entry older than at_us
  while from > 0 do
    local lo = max(0, from - step)
    local chunk = redis.call('LRANGE', key, lo, from - 1)
    local j = #chunk
    while j >= 1 and time_of(chunk[j]) >= at_us do j = j - 1 end
    from = lo + j
    if j >= 1 then break end
    step = step * 2
  end
  local tail = redis.call('LRANGE', key, from, -1)
  local kept, removed = {}, 0
  for i = 1, #tail do
    if removed < cost and time_of(tail[i]) == at_us then
      removed = removed + 1
    else
      kept[#kept + 1] = tail[i]
    end
  end
  if removed == 0 then return 0 end
  if from + #kept == 0 then
    redis.call('DEL', key)
    return 1
  end
  for i = 1, #kept do redis.call('LSET', key, from + i - 1, kept[i]) end
  redis.call('LTRIM', key, 0, from + #kept - 1)
  return 1
end

local M = {start = start, check = check, settle = settle, report = report, finish = finish,
           undo = undo}
return M
