-- wrk script of the production-like mix (bench/run.sh --mode mix, see bench/README.md):
-- every request comes through a trusted proxy (the gateway trusts 127.0.0.1/32) for one of
-- MIX_ADDRESSES client addresses (X-Forwarded-For, in 198.18.0.0/15, outside every trusted
-- range) and carries one of MIX_KEYS API keys (X-API-Key: mk00000, mk00001, ...; the first
-- MIX_TENANT_KEYS of them belong to tenants that bench/mix.py puts in Valkey). Address and key
-- are drawn uniformly at random for each request, from a fixed seed (MIX_SEED, plus the wrk
-- thread's number), so that every gateway gets the very same sequence of requests.
-- The strings are made once, in init(); request() only joins three of them.

local addresses = tonumber(os.getenv("MIX_ADDRESSES") or "") or 100000
local keys = tonumber(os.getenv("MIX_KEYS") or "") or 5000
local seed = tonumber(os.getenv("MIX_SEED") or "") or 1

-- done(): the WRKJSON line of wrk_report.lua, which sits beside this script.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "wrk_report.lua")

local threads = 0
function setup(thread)
  thread:set("thread_number", threads)
  threads = threads + 1
end

local head, address_part, key_part = nil, {}, {}
local random = math.random

function init(args)
  assert(addresses >= 1 and addresses <= 131072, "MIX_ADDRESSES: 1 to 131072 (198.18.0.0/15)")
  assert(keys >= 1 and keys <= 100000, "MIX_KEYS: 1 to 100000")
  math.randomseed(seed + (thread_number or 0))
  local fields = {}
  for name, value in pairs(wrk.headers) do
    fields[#fields + 1] = name .. ": " .. value .. "\r\n"
  end
  table.sort(fields)
  head = wrk.method .. " " .. wrk.path .. " HTTP/1.1\r\n" .. table.concat(fields) ..
         "X-Forwarded-For: "
  for i = 0, addresses - 1 do
    address_part[i + 1] = string.format("198.%d.%d.%d\r\nX-API-Key: ",
                                        18 + math.floor(i / 65536), math.floor(i / 256) % 256, i % 256)
  end
  for i = 0, keys - 1 do
    key_part[i + 1] = string.format("mk%05d\r\n\r\n", i)
  end
end

function request()
  return head .. address_part[random(addresses)] .. key_part[random(keys)]
end
