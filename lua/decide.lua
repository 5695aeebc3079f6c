-- decide: the rate limits of a batch of requests in one atomic script (all that one gateway
-- worker asked in one loop iteration). Each request is decided on its own, all or nothing: its
-- limits are first checked; only when no enforced limit refuses are they charged. When one
-- refuses, the others cost nothing; the refusing ones record the attempt only if they count
-- denied requests. Requests are decided in order, each seeing what the ones before it charged,
-- as if each had its own script. The time is the server's (TIME), so gateways with skewed
-- clocks agree.
--
-- Sluice runs this file after the algorithm modules, composed as
--   local ALGORITHMS = {}
--   ALGORITHMS['<name>'] = function(KEYS, ARGV) <lua/<name>.lua> end
--   <this file>
-- (see src/ratelimit/scripts.cc; tests compose it the same way from the files). Each call of
-- such a function with KEYS = nil returns the module; only the modules a batch uses are built,
-- once per call of the script. A module has
--   check(key, p, now_us) -> d       reads (and may charge) the limit with parameters p
--                                    (algorithm, limit, window, burst, cost, count_denied,
--                                    shadow); d.allowed says whether this request fits
--   settle(p, d, charge, id)         makes the request count (charge) or not
--   report(p, d, out, pos) -> pos    writes its 3 reply values after out[pos]
--   finish()                         optional: runs once after every request was decided
--
--   KEYS                the base keys of every limit of every request, in order:
--                       "<key_prefix>:<limit name>:<parts>"
--   ARGV[1]             D, the number of limit definitions
--   ARGV[2 .. 1 + 7D]   definition j: algorithm, limit, window_ms, burst, count_denied
--                       ("1"|"0"), shadow ("1"|"0": decided and charged like the others,
--                       never refuses), keep (the largest limit of the quotas that share the
--                       limit's keys: a plan's for one client, the limit's own for another; a
--                       sliding_log keeps that many entries)
--   then per request    its limits as "<definition>:<cost>" joined by ",", e.g. "1:1,2:3"
--                       (one key each, in that order); then its request id (unique;
--                       sliding_log members) if one of its limits is a sliding_log.
--                       "<limits>*<n>" (no request id) stands for n requests alike, same
--                       limits, same keys (written once), decided one after the other
--   reply               per request, in order, for each of its limits: remaining, reset_ms,
--                       retry_ms (0 when the limit allows this request, at least 1 when it
--                       refuses); the request is refused when a limit that is not a shadow
--                       refuses. Or, when deciding that request failed (say a key of the
--                       wrong type), one string in place of its values: the error. A failed
--                       request may have been charged in part, as any failed script; the
--                       others are decided as usual.
--                       For n requests alike: runs until n are covered, each either
--                       count c, the values v of the first (as above), then a step d for
--                       each value (request i of the run, from 0, has v + i * d); or one
--                       string, the error of one request. A module's optional
--                       many(key, p, now_us, n, out, pos) -> pos decides n requests alike on
--                       that limit alone in one step; otherwise each is a run of 1.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]  -- (strings: `+` and `*` read them)

-- The module of a limit's algorithm (found for `p` once per call).
local modules = {}
local function module_of(p)
  local name = p.algorithm
  local module = modules[name]
  if module == nil then
    local load = ALGORITHMS[name]
    if load == nil then error('unknown algorithm ' .. tostring(name)) end
    module = load(nil, nil)
    modules[name] = module
  end
  p.module = module
  return module
end

local definitions = ARGV[1] + 0
local cursor = 2 + 7 * definitions

-- The parameters of one limit of a request, "<definition>:<cost>", built once per call.
local params = {}
-- (Numbers are read with `+ 0`: on Valkey's Lua, half the cost of tonumber.)
local function params_of(ref)
  local j, cost = string.match(ref, '^(%d+):(%d+)$')
  j = j and j + 0
  if j == nil or j < 1 or j > definitions then error('no limit definition in ' .. ref) end
  local a = 2 + 7 * (j - 1)
  local p = {algorithm = ARGV[a], limit = ARGV[a + 1] + 0, window = ARGV[a + 2] + 0,
             burst = ARGV[a + 3] + 0, cost = cost + 0,
             count_denied = ARGV[a + 4] == '1', shadow = ARGV[a + 5] == '1',
             keep = ARGV[a + 6] + 0,
             module = false}  -- (every field in the constructor: one added resizes the table)
  params[ref] = p
  return p
end

-- A request's limits, by their text: the parameters of each (shared, read-only), parsed once
-- per call. Modules are found when deciding, so an unknown algorithm fails only its requests.
local parsed = {}
local function limits_of(text)
  local list = {times = 1, n = 0, needs_id = false}
  local body = text
  local star = string.find(text, '*', 1, true)
  if star then
    list.times = tonumber(string.sub(text, star + 1)) or 0
    body = string.sub(text, 1, star - 1)
    if list.times < 1 then error('no request count in ' .. text) end
  end
  local from = 1
  while true do
    local comma = string.find(body, ',', from, true)
    local ref = body  -- one limit, the usual case
    if comma or from > 1 then ref = string.sub(body, from, (comma or 0) - 1) end
    local p = params[ref] or params_of(ref)
    list[#list + 1] = p
    if p.algorithm == 'sliding_log' then list.needs_id = true end
    if not comma then break end
    from = comma + 1
  end
  list.n = #list
  if list.needs_id and list.times > 1 then error('each request needs its id in ' .. text) end
  parsed[text] = list
  return list
end

local reply = {}
local checked = {}
-- Decides one request whose keys follow KEYS[k]; writes its reply after reply[pos]. Returns
-- the new end of the reply.
local function decide(list, k, id, pos)
  local n = list.n
  if n == 1 then
    -- Alone, a limit is charged when it allows or counts denied requests: the rule below,
    -- for one (if it refuses, so does the request, unless it is a shadow).
    local p = list[1]
    local m = p.module or module_of(p)
    local d = m.check(KEYS[k + 1], p, now)
    m.settle(p, d, d.allowed or p.count_denied, id)
    return m.report(p, d, reply, pos)
  end
  local refused = false
  for i = 1, n do
    local p = list[i]
    local d = (p.module or module_of(p)).check(KEYS[k + i], p, now)
    checked[i] = d
    if not d.allowed and not p.shadow then refused = true end
  end
  for i = 1, n do
    local p, d = list[i], checked[i]
    local charge
    if refused then
      charge = not d.allowed and not p.shadow and p.count_denied
    else
      charge = d.allowed or p.count_denied
    end
    p.module.settle(p, d, charge, id)
    pos = p.module.report(p, d, reply, pos)
  end
  return pos
end

local function error_text(result)
  if type(result) == 'table' then result = result.err end
  return tostring(result)
end

-- n requests alike in one step, when their only limit's module can (nil when it cannot).
local function decide_many(list, k, n, pos)
  if list.n ~= 1 then return nil end
  local p = list[1]
  local m = p.module or module_of(p)
  if m.many == nil then return nil end
  return m.many(KEYS[k + 1], p, now, n, reply, pos)
end

-- n requests alike, one after the other, each a run of its own.
local function decide_each(list, k, n, pos)
  local m = 3 * list.n
  for _ = 1, n do
    local ok, result = pcall(decide, list, k, '', pos + 1)
    if ok then
      reply[pos + 1] = 1
      for i = 1, m do reply[result + i] = 0 end
      pos = result + m
    else
      pos = pos + 1
      reply[pos] = error_text(result)
    end
  end
  return pos
end

local pos = 0
local k = 0
local last = #ARGV
while cursor <= last do
  local text = ARGV[cursor]
  local list = parsed[text] or limits_of(text)
  cursor = cursor + 1
  local id = ''
  if list.needs_id then
    id = ARGV[cursor]
    cursor = cursor + 1
  end
  local n = list.times
  if n == 1 then
    local ok, result = pcall(decide, list, k, id, pos)
    if ok then
      pos = result
    else
      pos = pos + 1
      reply[pos] = error_text(result)
    end
  else
    local ok, result = pcall(decide_many, list, k, n, pos)
    if not ok then  -- all of them fail alike
      result = error_text(result)
      for _ = 1, n do
        pos = pos + 1
        reply[pos] = result
      end
    elseif result then
      pos = result
    else
      pos = decide_each(list, k, n, pos)
    end
  end
  k = k + list.n
end
reply[pos + 1] = nil  -- what a failed request wrote past its error
for _, module in pairs(modules) do
  if module.finish then module.finish() end
end
return reply
