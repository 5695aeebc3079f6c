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
-- once per call of the script.
--
--   KEYS                the base keys of every limit of every request, in order:
--                       "<key_prefix>:<limit name>:<parts>"
--   ARGV[1]             D, the number of limit definitions
--   ARGV[2 .. 1 + 6D]   definition j: algorithm, limit, window_ms, burst, count_denied
--                       ("1"|"0"), shadow ("1"|"0": decided and charged like the others,
--                       never refuses)
--   then per request    its limits as "<definition>:<cost>" joined by ",", e.g. "1:1,2:3"
--                       (one key each, in that order); then its request id (unique;
--                       sliding_log members) if one of its limits is a sliding_log
--   reply               per request, in order: {allowed (1|0), then for each of its limits:
--                       allowed (1|0), remaining, reset_ms, retry_ms}, or, when deciding
--                       that request failed (say a key of the wrong type), one string: the
--                       error. A failed request may have been charged in part, as any failed
--                       script; the others are decided as usual.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local modules = {}
local function module_of(name)
  local module = modules[name]
  if module == nil then
    local load = ALGORITHMS[name]
    if load == nil then error('unknown algorithm ' .. tostring(name)) end
    module = load(nil, nil)
    modules[name] = module
  end
  return module
end

local defs = {}
for j = 1, tonumber(ARGV[1]) do
  local a = 2 + 6 * (j - 1)
  defs[j] = {algorithm = ARGV[a], limit = tonumber(ARGV[a + 1]), window = tonumber(ARGV[a + 2]),
             burst = tonumber(ARGV[a + 3]), count_denied = ARGV[a + 4] == '1',
             shadow = ARGV[a + 5] == '1', by_cost = {}}
end
local cursor = 2 + 6 * #defs

-- A request's limits, by their text: the parameters of each (shared, read-only), parsed once
-- per batch. Modules are found when deciding, so an unknown algorithm fails only its requests.
local parsed = {}
local function limits_of(text)
  local list = parsed[text]
  if list ~= nil then return list end
  list = {}
  for j, cost in string.gmatch(text, '(%d+):(%d+)') do
    local def = defs[tonumber(j)]
    if def == nil then error('no limit definition ' .. j) end
    cost = tonumber(cost)
    local p = def.by_cost[cost]
    if p == nil then
      p = {algorithm = def.algorithm, limit = def.limit, window = def.window, burst = def.burst,
           cost = cost, count_denied = def.count_denied, shadow = def.shadow}
      def.by_cost[cost] = p
    end
    list[#list + 1] = p
    if def.algorithm == 'sliding_log' then list.needs_id = true end
  end
  parsed[text] = list
  return list
end

local reply = {}
local checked = {}
-- Decides one request whose keys follow KEYS[k]; writes its reply after reply[pos]. Returns
-- the new end of the reply.
local function decide(list, k, id, pos)
  local refused = false
  for i = 1, #list do
    local p = list[i]
    if p.module == nil then p.module = module_of(p.algorithm) end
    local d = p.module.check(KEYS[k + i], p, now)
    checked[i] = d
    if not d.allowed and not p.shadow then refused = true end
  end
  pos = pos + 1
  reply[pos] = refused and 0 or 1
  for i = 1, #list do
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

local pos = 0
local k = 0
while cursor <= #ARGV do
  local list = limits_of(ARGV[cursor])
  cursor = cursor + 1
  local id = ''
  if list.needs_id then
    id = ARGV[cursor]
    cursor = cursor + 1
  end
  local ok, result = pcall(decide, list, k, id, pos)
  if ok then
    pos = result
  else
    if type(result) == 'table' then result = result.err end
    pos = pos + 1
    reply[pos] = tostring(result)
  end
  k = k + #list
end
reply[pos + 1] = nil  -- what a failed request wrote past its error
return reply
