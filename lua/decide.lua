-- The decide layout, on the script's side (src/ratelimit/script_codec.h, the gateway's one
-- codec, opens with the same description): decide_batch reads a call and writes its reply,
-- undo_batch reads an undo. Nothing else reads or writes them.
--
--   KEYS               each key the call's limits use, once, in order of first use; the
--                      script touches no other
--   ARGV[1]            D, the number of limit definitions
--   ARGV[2 .. 1 + 7D]  7 per definition: algorithm, limit, window_ms, burst, count_denied
--                      ("1"|"0"), shadow ("1"|"0": charged like the others, never refuses),
--                      keep (the largest limit of the quotas on the limit's keys: what a
--                      sliding_log keeps)
--   then per request   its limits as "<definition>:<cost>" joined by "," ("1:1,2:3"); each
--                      takes the next key not used before, or, written
--                      "<definition>:<cost>@<i>", KEYS[i]. A cost followed by "~" is
--                      checked but not charged (cost_from: charged later); by "!", charged
--                      whether it fits or not (that later charge; the limit may go into
--                      debt). Then one ARGV per concurrency limit of the request, in order:
--                      the name of the slot it takes (a lease, unique per request)
--   numbers            whole: limit, window_ms, burst and keep 1 .. 10^15, a cost 0 .. 10^15
--                      (kMaxCost); a request naming one outside (or a key past KEYS) fails
--                      alone, its error in the reply; waits in the reply are at most
--                      (2^31 - 1) s (kMaxWaitMs), the gateway clamps any larger one
--   reply              the call's time T (server microseconds; every charge of the call is of
--                      that time), then per request, in order: remaining, reset_ms, retry_ms
--                      per limit (retry_ms 0: the limit allows, at least 1: it refuses; the
--                      request is refused when a limit that is not a shadow refuses), and for
--                      a token_bucket limit whose definition is a shadow that counts denied
--                      requests a 4th: the debt (whole us, rounded down) its charge added (a
--                      refusal empties the bucket: not the cost), or, when deciding it failed,
--                      one string: the error
--   undo               function <decide function>_undo, which takes back a call's charges (a
--                      request refused in another slot): KEYS the keys, ARGV 5 per key:
--                      algorithm, limit, window_ms, cost, T of the call that charged it (a
--                      concurrency limit: the name of the slot); a token_bucket's cost may be
--                      written "u<N>": N us of debt (a decide reply's 4th value) instead of
--                      cost tokens; reply: how many keys it changed
--   lease              function <decide function>_lease, on concurrency slots: KEYS the keys,
--                      ARGV[1] "renew" or "release", then 2 per key: the slot's name, the
--                      lease (ms). renew: a slot still held is held for the lease from now
--                      (one that expired stays free); release: frees it. Reply: how many
--                      slots it found
--   (a concurrency limit's window_ms is its lease; its key is a sorted set: slot names
--   scored with the server time, in microseconds, when their lease ends)
--   peek               function <decide function>_peek, what the next request of cost 1 would
--                      be told about one key, charging nothing (the admin's GET /limits):
--                      KEYS[1] the key, ARGV the 7 fields of one definition (as above);
--                      reply: remaining, reset_ms, retry_ms (as a decide reply's limit)
--
-- decide: the rate limits of a batch of requests in one atomic script (all that one gateway
-- worker asked in one loop iteration). Each request is decided on its own, all or nothing: its
-- limits are first checked; only when no enforced limit refuses are they charged. When one
-- refuses, the others cost nothing; the refusing ones record the attempt only if they count
-- denied requests. Requests are decided in order, each seeing what the ones before it charged,
-- as if each had its own script. The time is the server's (TIME), so gateways with skewed
-- clocks agree.
--
-- Sluice loads this file as a Valkey function library (FUNCTION LOAD), composed as
--   #!lua name=sluice_<hash>
--   local FUNCTION_NAME = 'sluice_decide_<hash>'
--   local ALGORITHMS = {}
--   ALGORITHMS['<name>'] = function() <lua/<name>.lua> end
--   <this file>
-- (<hash>: of the modules and this file; see src/ratelimit/scripts.cc) and calls it with
-- FCALL. Each ALGORITHMS function returns its module (nothing else runs a module); the library
-- builds every module once, at its first call, and they keep their tables from call to call
-- (a call reuses them instead of building new ones).
-- A module keeps each key's state by the key's index for the whole call (several requests of a
-- batch may meet one key) and writes each changed key once:
--   start()           a new call begins: every key index's state is stale
--   check(k, key, value, p, now_us, slot) -> allowed
--                     reads KEYS[k] = key, whose value (fetched with every other key by one
--                     MGET; false when absent) it reads the first time, and says whether this
--                     request fits limit p (algorithm, limit, window, burst, cost,
--                     count_denied, shadow, keep; later: charge nothing now; forced: charge
--                     even if it does not fit); slot: a concurrency limit's slot name
--   settle(k, p, allowed, charge, slot)       makes this request count (charge) or not
--   report(k, p, allowed, out, pos) -> pos    writes its 3 reply values after out[pos]
--   finish()                                  writes every key the call changed (it never
--                     fails: each module keeps the values it writes within its ceilings)
--   undo(key, limit, window_ms, cost, at_us, now_us) -> 1 if it changed the key
--                     takes back `cost` charged at at_us (the time of an earlier call), as
--                     exactly as the key allows (see each module), reading and writing the key
--                     (concurrency: at_us is the slot's name, which it frees)
--   lease(op, key, slot, lease_ms, now_us) -> 1 if it found the slot   (concurrency only)
-- (A key of another type reads as absent, and the write replaces it.)

-- Every module, by algorithm name, built by the first call (while a library loads, its code
-- sees no globals: no math, no struct).
local modules

-- What the running call decides with (set when it starts): its KEYS, their values (one MGET
-- instead of one command per limit; a key of another type reads as absent, and the write
-- replaces it), the server's time (us), the reply.
local keys, values, now, nkeys
local reply = {}

-- The module of a limit's algorithm (found for `p` once).
local function module_of(p)
  local module = modules[p.algorithm]
  if module == nil then error('unknown algorithm ' .. tostring(p.algorithm)) end
  p.module = module
  return module
end

-- The parameters of each limit definition and cost ("<definition>:<cost>") and each request's
-- limits (by their text), parsed once and kept while the calls' definitions stay the same
-- (one gateway's configuration): `definitions` holds the ARGV strings they were read from.
local definitions, params, parsed, parsed_count = {}, {}, {}, 0
local PARSED_MAX = 4096  -- texts kept at most (each names its key indices)

-- The layout's numbers, as protocol/decide_protocol.h names them (a unit test of the gateway
-- reads them here and compares): fields per definition, per key of an undo and of a lease.
local DEFINITION_FIELDS = 7  -- kDefinitionFields
local UNDO_FIELDS = 5        -- kUndoFieldsPerKey
local LEASE_FIELDS = 2       -- kLeaseFieldsPerKey

-- Keeps the parsed texts only when ARGV's definitions are those they were parsed from.
-- Returns the number of definitions.
local function read_definitions(ARGV)
  local d = ARGV[1] + 0
  -- (a D past the arguments: the definitions are all there are, and no request follows; never
  -- a loop over 7 * D fields that are not there)
  local fields = math.min(DEFINITION_FIELDS * d, #ARGV - 1)
  local same = #definitions == fields and parsed_count < PARSED_MAX
  if same then
    for i = 1, fields do
      if definitions[i] ~= ARGV[i + 1] then
        same = false
        break
      end
    end
  end
  if not same then
    definitions = {}
    for i = 1, fields do definitions[i] = ARGV[i + 1] end
    params, parsed, parsed_count = {}, {}, 0
  end
  return d
end

-- The ceiling of every count a call brings: limits, bursts, costs and windows (ms) are whole
-- numbers from 0 (a cost) or 1 to 10^15, the configuration's range, so that the modules'
-- arithmetic on them stays exact in Lua's doubles (below 2^53) and every value they write is a
-- whole number that format('%d') renders exactly. A value outside fails only the requests that
-- name it (params_of runs once per text).
local MAX_COUNT = 1e15  -- kMaxCount
local MAX_DEBT_US = 2147483647e6  -- kMaxDebtUs: a token bucket's debt, (2^31 - 1) s
local function bounded(text, low, what, ref)
  local v = tonumber(text)
  if v == nil or not (v >= low and v <= MAX_COUNT) or v % 1 ~= 0 then
    error(what .. ' out of range in ' .. ref)
  end
  return v
end

-- The parameters of a limit definition's 7 fields (from fields[a + 1]) and a cost.
local function params_from(fields, a, cost, mode, ref)
  return {algorithm = fields[a + 1], limit = bounded(fields[a + 2], 1, 'limit', ref),
          window = bounded(fields[a + 3], 1, 'window', ref),
          burst = bounded(fields[a + 4], 1, 'burst', ref), cost = bounded(cost, 0, 'cost', ref),
          count_denied = fields[a + 5] == '1', shadow = fields[a + 6] == '1',
          keep = bounded(fields[a + 7], 1, 'keep', ref), later = mode == '~',
          forced = mode == '!', slots = fields[a + 1] == 'concurrency',
          module = false}  -- (every field in the constructor: one added resizes the table)
end

-- The definition index j of ref, valid or an error.
local function definition_of(ref)
  local j, cost, mode = string.match(ref, '^(%d+):(%d+)([~!]?)$')
  j = j and tonumber(j)
  if j == nil or j < 1 or DEFINITION_FIELDS * j > #definitions then
    error('no limit definition in ' .. ref)
  end
  return j, cost, mode
end

local function params_of(ref)
  local j, cost, mode = definition_of(ref)
  local p = params_from(definitions, DEFINITION_FIELDS * (j - 1), cost, mode, ref)
  params[ref] = p
  return p
end

-- A request's limits, by their text: the parameters of each (shared, read-only), where its
-- key is (`at`: a key index, or false for the next new key) and how many slot names follow
-- the text (`slots`: its concurrency limits). Modules are found when deciding, so an unknown
-- algorithm fails only its requests. A text that cannot be read keeps why in `error` (its
-- request answers that; the call's others are decided): its keys and slot names are still
-- counted, so that the requests after it find theirs.
local function limits_of(text)
  local list = {n = 0, fresh = 0, slots = 0, special = false, at = {}, error = false}
  local from = 1
  while true do
    local comma = string.find(text, ',', from, true)
    local ref = text  -- one limit, the usual case
    if comma or from > 1 then ref = string.sub(text, from, (comma or 0) - 1) end
    local i = list.n + 1
    local mark = string.find(ref, '@', 1, true)
    if mark then
      local at = tonumber(string.sub(ref, mark + 1))
      if at == nil or at < 1 or at % 1 ~= 0 then
        list.error = list.error or ('bad key index in ' .. ref)
        at = 1
      end
      list.at[i] = at
      ref = string.sub(ref, 1, mark - 1)
    else
      list.fresh = list.fresh + 1
      list.at[i] = false
    end
    local ok, p = true, params[ref]
    if not p then ok, p = pcall(params_of, ref) end
    if ok then
      list[i] = p
      if p.slots then list.slots = list.slots + 1 end
      if p.slots or p.later or p.forced then list.special = true end
    else
      if type(p) == 'table' then p = p.err end
      list.error = list.error or tostring(p)
      local found, j = pcall(definition_of, ref)
      if found and definitions[DEFINITION_FIELDS * (j - 1) + 1] == 'concurrency' then
        list.slots = list.slots + 1
      end
    end
    list.n = i
    if not comma then break end
    from = comma + 1
  end
  parsed[text] = list
  parsed_count = parsed_count + 1
  return list
end

local indices, fits, names = {}, {}, {}
-- Decides one request whose new keys follow KEYS[k]; writes its reply after reply[pos].
-- Returns the new end of the reply. (The usual case: no concurrency slot, no later or forced
-- charge; those go through decide_special. Kept apart on purpose: one function for both costs
-- Valkey about 2% more work on every usual request, bench/script_cost.py under callgrind.)
local function decide(list, k, pos)
  local n, at = list.n, list.at
  if n == 1 then
    -- Alone, a limit is charged when it allows or counts denied requests: the rule below,
    -- for one (if it refuses, so does the request, unless it is a shadow).
    local p = list[1]
    local m = p.module or module_of(p)
    local i = at[1] or k + 1
    if i > nkeys then error('no key ' .. i) end
    local allowed = m.check(i, keys[i], values[i], p, now)
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
    if i > nkeys then error('no key ' .. i) end
    local allowed = (p.module or module_of(p)).check(i, keys[i], values[i], p, now)
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

-- The same for a request with a concurrency limit (whose slot names start at ARGV[s]) or a
-- later or forced charge: the same rule, with a slot name for each concurrency limit, no
-- charge now for a later one, and a forced one charged whether it fits or not.
local function decide_special(list, k, pos, ARGV, s)
  local n, at = list.n, list.at
  local refused = false
  local fresh = k
  for j = 1, n do
    local p = list[j]
    local i = at[j]
    if not i then
      fresh = fresh + 1
      i = fresh
    end
    if i > nkeys then error('no key ' .. i) end
    local slot = false
    if p.slots then
      slot = ARGV[s]
      s = s + 1
    end
    local allowed = (p.module or module_of(p)).check(i, keys[i], values[i], p, now, slot)
    if p.forced then allowed = true end  -- charged whatever is left: into debt if need be
    indices[j], fits[j], names[j] = i, allowed, slot
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
    p.module.settle(i, p, allowed, charge and not p.later, names[j])
    pos = p.module.report(i, p, allowed, reply, pos)
  end
  return pos
end

local function build_modules()
  if modules ~= nil then return end
  modules = {}
  for name, load in pairs(ALGORITHMS) do modules[name] = load() end
end

-- One call: the requests of ARGV, in order.
local function decide_batch(KEYS, ARGV)
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]  -- (strings: `+` and `*` read them)
  keys, values, nkeys = KEYS, redis.call('MGET', unpack(KEYS)), #KEYS
  build_modules()
  for _, module in pairs(modules) do module.start() end
  local cursor = 2 + DEFINITION_FIELDS * read_definitions(ARGV)
  reply[1] = now
  local pos = 1
  local k = 0
  local last = #ARGV
  while cursor <= last do
    local text = ARGV[cursor]
    local list = parsed[text] or limits_of(text)
    cursor = cursor + 1
    local ok, result
    if list.error then
      ok, result = false, list.error
    elseif list.special then
      ok, result = pcall(decide_special, list, k, pos, ARGV, cursor)
    else
      ok, result = pcall(decide, list, k, pos)
    end
    if ok then
      pos = result
    else
      if type(result) == 'table' then result = result.err end
      pos = pos + 1
      reply[pos] = tostring(result)
    end
    cursor = cursor + list.slots
    k = k + list.fresh
  end
  reply[pos + 1] = nil  -- the end (what a longer call or a failed request wrote lies past it)
  for _, module in pairs(modules) do module.finish() end
  keys, values = nil, nil
  return reply
end

-- Takes back what an earlier call charged (the undo layout above).
local function undo_batch(KEYS, ARGV)
  local t = redis.call('TIME')
  local now_us = t[1] * 1000000 + t[2]
  build_modules()
  local changed = 0
  for i = 1, #KEYS do
    local a = UNDO_FIELDS * (i - 1)
    local module = modules[ARGV[a + 1]]
    if module == nil then error('unknown algorithm ' .. tostring(ARGV[a + 1])) end
    local at = ARGV[a + 5]  -- a time, or a concurrency slot's name
    if ARGV[a + 1] ~= 'concurrency' then at = at + 0 end
    local cost, debt_us = ARGV[a + 4], false  -- tokens, or "u<N>": N us of a bucket's debt
    if string.byte(cost) == 117 then
      debt_us = tonumber(string.sub(cost, 2))
      if debt_us == nil or not (debt_us >= 0 and debt_us <= MAX_DEBT_US) or debt_us % 1 ~= 0
          or ARGV[a + 1] ~= 'token_bucket' then
        error('bad debt in an undo: ' .. cost)
      end
      cost = 0
    end
    changed = changed + module.undo(KEYS[i], ARGV[a + 2] + 0, ARGV[a + 3] + 0, cost + 0, at,
                                    now_us, debt_us)
  end
  return changed
end

-- Renews or frees concurrency slots (the lease layout above).
local function lease_batch(KEYS, ARGV)
  local t = redis.call('TIME')
  local now_us = t[1] * 1000000 + t[2]
  build_modules()
  local op = ARGV[1]
  if op ~= 'renew' and op ~= 'release' then error('unknown lease operation ' .. tostring(op)) end
  local found = 0
  for i = 1, #KEYS do
    local a = LEASE_FIELDS * (i - 1) + 1
    found = found + modules.concurrency.lease(op, KEYS[i], ARGV[a + 1], ARGV[a + 2] + 0, now_us)
  end
  return found
end

-- What the next request of cost 1 would be told about one key, charging nothing (the peek
-- layout above). Generic over modules: start, check and report, never settle or finish.
local function peek(KEYS, ARGV)
  local t = redis.call('TIME')
  local now_us = t[1] * 1000000 + t[2]
  build_modules()
  local p = params_from(ARGV, 0, '1', '', 'the peek')
  local module = module_of(p)
  local key = KEYS[1]
  local value = false  -- as MGET reads it: a key of another type is absent
  if redis.call('TYPE', key).ok == 'string' then value = redis.call('GET', key) end
  module.start()
  local allowed = module.check(1, key, value, p, now_us)
  local out = {}
  module.report(1, p, allowed, out, 0)
  out[4] = nil  -- (a token bucket's charge: none, and a peek's reply is 3 values)
  return out
end

redis.register_function(FUNCTION_NAME, decide_batch)
redis.register_function(FUNCTION_NAME .. '_undo', undo_batch)
redis.register_function(FUNCTION_NAME .. '_lease', lease_batch)
redis.register_function(FUNCTION_NAME .. '_peek', peek)
