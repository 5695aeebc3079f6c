-- decide: every limit of one request in one atomic script, all or nothing. Each limit is first
-- checked (nothing is charged); only when no enforced limit refuses are the limits charged.
-- When one refuses, the others cost nothing; the refusing ones record the attempt only if
-- they count denied requests. The time is the server's (TIME), so gateways with skewed clocks
-- agree.
--
-- Sluice runs this file after the algorithm modules, composed as
--   local ALGORITHMS = {}
--   ALGORITHMS['<name>'] = function(KEYS, ARGV) <lua/<name>.lua> end
--   <this file>
-- (see src/ratelimit/scripts.cc; tests compose it the same way from the files). Each call of
-- such a function with KEYS = nil returns the module; only the modules a request uses are
-- built, once per call of the script.
--
--   KEYS[i]         base key of limit i: "<key_prefix>:<limit name>:<parts>"
--   ARGV[1]         request id (unique; sliding_log members)
--   ARGV[2 + 7(i-1) ... 8 + 7(i-1)], for limit i:
--                   algorithm name, limit, window_ms, burst, cost, count_denied ("1"|"0"),
--                   shadow ("1"|"0": decided and charged like the others, never refuses)
--   reply           {allowed (1|0), then for each limit i:
--                    allowed (1|0), remaining, reset_ms, retry_ms}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local limits = {}
local refused = false
local modules = {}
for i = 1, #KEYS do
  local a = 2 + 7 * (i - 1)
  local p = {algorithm = ARGV[a], limit = tonumber(ARGV[a + 1]), window = tonumber(ARGV[a + 2]),
             burst = tonumber(ARGV[a + 3]), cost = tonumber(ARGV[a + 4]),
             count_denied = ARGV[a + 5] == '1', shadow = ARGV[a + 6] == '1', id = ARGV[1]}
  local module = modules[p.algorithm]
  if module == nil then
    local load = ALGORITHMS[p.algorithm]
    if load == nil then return redis.error_reply('unknown algorithm ' .. tostring(p.algorithm)) end
    module = load(nil, nil)
    modules[p.algorithm] = module
  end
  local d = module.check(KEYS[i], p, now)
  limits[i] = {p = p, d = d, module = module}
  if not d.allowed and not p.shadow then refused = true end
end
local reply = {refused and 0 or 1}
for i = 1, #limits do
  local l = limits[i]
  local charge
  if refused then
    charge = not l.d.allowed and not l.p.shadow and l.p.count_denied
  else
    charge = l.d.allowed or l.p.count_denied
  end
  if charge then l.module.commit(l.p, l.d) end
  local r = l.module.report(l.p, l.d)
  for j = 1, 4 do reply[#reply + 1] = r[j] end
end
return reply
