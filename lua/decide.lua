-- decide: the rate limits of a batch of requests in one atomic script (all that one gateway
-- worker asked in one loop iteration). Each request is decided on its own, all or nothing: its
-- limits are first checked; only when no enforced limit refuses are they charged. When one
-- refuses, the others cost nothing; the refusing ones record the attempt only if they count
-- denied requests. Requests are decided in order, each seeing what the ones before it charged,
-- as if each had its own script. The time is the server's (TIME), so gateways with skewed
-- clocks agree.
--
-- Layout (the one codec on the gateway's side, src/ratelimit/decision.h ScriptBatch and
-- DecisionReader, opens with the same description):
--   KEYS                every key the batch's limits use, each once, in order of first use:
--                       "<key_prefix>:<limit name>:{<parts>}"; the script touches no other
--   ARGV[1]             D, the number of limit definitions
--   ARGV[2 .. 1 + 7D]   definition j: algorithm, limit, window_ms, burst, count_denied
--                       ("1"|"0"), shadow ("1"|"0": decided and charged like the others,
--                       never refuses), keep (the largest limit of the quotas that share the
--                       limit's keys: a plan's for one client, the limit's own for another; a
--                       sliding_log keeps that many entries)
--   then per request    its limits as "<definition>:<cost>" joined by ",", e.g. "1:1,2:3";
--                       each takes the next key not used before, or, written
--                       "<definition>:<cost>@<i>", KEYS[i], a key an earlier request used
--   reply               per request, in order, for each of its limits: remaining, reset_ms,
--                       retry_ms (0 when the limit allows this request, at least 1 when it
--                       refuses); the request is refused when a limit that is not a shadow
--                       refuses. Or, when deciding that request failed (an unknown algorithm,
--                       say), one string in place of its values: the error; the others are
--                       decided as usual.
--
-- Sluice runs this file after the algorithm modules, composed as
--   local ALGORITHMS = {}
--   ALGORITHMS['<name>'] = function(KEYS, ARGV) <lua/<name>.lua> end
--   <this file>
-- (see src/ratelimit/scripts.cc; tests compose it the same way from the files). Each call of
-- such a function with KEYS = nil returns the module; only the modules a batch uses are built,
-- once per call of the script. A module keeps each key's state by the key's index for the
-- whole call (several requests of a batch may meet one key) and writes each changed key once:
--   check(k, key, value, p, now_us) -> allowed
--                     reads KEYS[k] = key, whose value (fetched with every other key by one
--                     MGET; false when absent) it reads the first time, and says whether this
--                     request fits limit p (algorithm, limit, window, burst, cost,
--                     count_denied, shadow, keep)
--   settle(k, p, allowed, charge)             makes this request count (charge) or not
--   report(k, p, allowed, out, pos) -> pos    writes its 3 reply values after out[pos]
--   finish()                                  writes every key the call changed
-- (A key of another type reads as absent, and the write replaces it.)
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]  -- (strings: `+` and `*` read them)
-- Every key's value at once: one command instead of one per limit. (A key of another type
-- reads as absent, and the write replaces it.)
local values = redis.call('MGET', unpack(KEYS))

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

-- The parameters of one limit definition and cost, "<definition>:<cost>", built once per call.
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

-- A request's limits, by their text: the parameters of each (shared, read-only) and where its
-- key is (`at`: a key index, or false for the next new key), parsed once per call. Modules are
-- found when deciding, so an unknown algorithm fails only its requests.
local parsed = {}
local function limits_of(text)
  local list = {n = 0, fresh = 0, at = {}}
  local from = 1
  while true do
    local comma = string.find(text, ',', from, true)
    local ref = text  -- one limit, the usual case
    if comma or from > 1 then ref = string.sub(text, from, (comma or 0) - 1) end
    local i = list.n + 1
    local mark = string.find(ref, '@', 1, true)
    if mark then
      list.at[i] = string.sub(ref, mark + 1) + 0
      ref = string.sub(ref, 1, mark - 1)
    else
      list.fresh = list.fresh + 1
      list.at[i] = false
    end
    list[i] = params[ref] or params_of(ref)
    list.n = i
    if not comma then break end
    from = comma + 1
  end
  parsed[text] = list
  return list
end

local reply = {}
local indices, fits = {}, {}
-- Decides one request whose new keys follow KEYS[k]; writes its reply after reply[pos].
-- Returns the new end of the reply.
local function decide(list, k, pos)
  local n, at = list.n, list.at
  if n == 1 then
    -- Alone, a limit is charged when it allows or counts denied requests: the rule below,
    -- for one (if it refuses, so does the request, unless it is a shadow).
    local p = list[1]
    local m = p.module or module_of(p)
    local i = at[1] or k + 1
    local allowed = m.check(i, KEYS[i], values[i], p, now)
    m.settle(i, p, allowed, allowed or p.count_denied)
    return m.report(i, p, allowed, reply, pos)
  end
  local refused = false
  local fresh = k
  for j = 1, n do
    local p = list[j]
    local i = at[j]
    if not i then
      fresh = fresh + 1
      i = fresh
    end
    local allowed = (p.module or module_of(p)).check(i, KEYS[i], values[i], p, now)
    indices[j], fits[j] = i, allowed
    if not allowed and not p.shadow then refused = true end
  end
  for j = 1, n do
    local p, i, allowed = list[j], indices[j], fits[j]
    local charge
    if refused then
      charge = not allowed and not p.shadow and p.count_denied
    else
      charge = allowed or p.count_denied
    end
    p.module.settle(i, p, allowed, charge)
    pos = p.module.report(i, p, allowed, reply, pos)
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
  local ok, result = pcall(decide, list, k, pos)
  if ok then
    pos = result
  else
    if type(result) == 'table' then result = result.err end
    pos = pos + 1
    reply[pos] = tostring(result)
  end
  k = k + list.fresh
end
reply[pos + 1] = nil  -- what a failed request wrote past its error
for _, module in pairs(modules) do module.finish() end
return reply
