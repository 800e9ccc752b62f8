-- wrk script for `make bench`: which tenant each request names, and a
-- count of every response status.
--
--   wrk ... -s bench/tenants.lua URL -- HEADER MODE ARG...
--     uniform PREFIX N      tenants PREFIX0000 .. PREFIX<N-1>, uniformly at random
--     zipf    PREFIX N S    the same tenants, Zipf-distributed with exponent S
--                           (PREFIX0000 is the most frequent)
--     single  TENANT        every request names TENANT
--
-- The requests are formatted once per thread in init(); request() only
-- picks one, so the client spends no time building them. done() prints one
-- line `TRL-WRK {json}` with the totals, the latency percentiles (µs) and
-- the status counts summed over every thread.
--
-- Windows (only when the environment names tenants to track): with
-- TRL_WRK_TRACK=tenant,tenant,... every request to a tracked tenant is
-- counted per second it was sent (client clock, os.time()), and done() adds
-- "windows": {tenant: {"sent": {sec: n}}}. bench.py counts the admitted ones
-- where they arrive (the upstream's access log) and derives admitted
-- requests per quota window from both.

local threads = {}

function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

local requests = {}
local order = {}
local n_order = 0
local next_i = 0
statuses = {}
-- Tracking (TRL_WRK_TRACK): the tenant of each request index, or false.
local tracked_of = {}
local tracked = {}
local tracking = false
sent = {}

local function tenant_name(prefix, i)
  return string.format("%s%04d", prefix, i)
end

function init(args)
  local header, mode = args[1], args[2]
  if header == nil or mode == nil then
    error("usage: -- HEADER uniform PREFIX N | zipf PREFIX N S | single TENANT")
  end
  math.randomseed(os.time() * 1000 + id)
  local function req(tenant)
    return wrk.format(nil, nil, { [header] = tenant })
  end
  if mode == "single" then
    requests[1] = req(args[3])
    order[1] = 1
  elseif mode == "uniform" or mode == "zipf" then
    local prefix, n = args[3], tonumber(args[4])
    for i = 1, n do requests[i] = req(tenant_name(prefix, i - 1)) end
    -- A fixed random sequence of 65,536 picks per thread, replayed in a loop.
    local cdf = nil
    if mode == "zipf" then
      local s, total = tonumber(args[5]), 0
      cdf = {}
      for i = 1, n do total = total + 1 / (i ^ s); cdf[i] = total end
      for i = 1, n do cdf[i] = cdf[i] / total end
    end
    for k = 1, 65536 do
      if cdf == nil then
        order[k] = math.random(n)
      else
        local u, lo, hi = math.random(), 1, n
        while lo < hi do
          local mid = math.floor((lo + hi) / 2)
          if cdf[mid] < u then lo = mid + 1 else hi = mid end
        end
        order[k] = lo
      end
    end
  else
    error("unknown mode " .. mode)
  end
  n_order = #order
  local track = os.getenv("TRL_WRK_TRACK") or ""
  for name in string.gmatch(track, "[^,]+") do
    tracked[name] = true
    tracking = true
  end
  if tracking then
    if mode == "single" then
      tracked_of[1] = tracked[args[3]] and args[3] or false
    else
      for i = 1, #requests do
        local name = tenant_name(args[3], i - 1)
        tracked_of[i] = tracked[name] and name or false
      end
    end
  end
end

-- Flat tables keyed "tenant second": wrk's thread:get copies only flat
-- tables between Lua states (a nested one fails with "invalid key to 'next'").
local function bump(t, tenant, sec)
  local key = tenant .. " " .. sec
  t[key] = (t[key] or 0) + 1
end

function request()
  next_i = next_i % n_order + 1
  local i = order[next_i]
  if tracking then
    local name = tracked_of[i]
    if name then bump(sent, name, os.time()) end
  end
  return requests[i]
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

local function windows_json()
  local total = {}
  for _, t in ipairs(threads) do
    for _, kind in ipairs({"sent"}) do
      for key, n in pairs(t:get(kind) or {}) do
        local name, sec = string.match(key, "^(.*) (%d+)$")
        total[name] = total[name] or {sent = {}}
        local into = total[name][kind]
        into[sec] = (into[sec] or 0) + n
      end
    end
  end
  local tenants = {}
  for name, kinds in pairs(total) do
    local parts = {}
    for _, kind in ipairs({"sent"}) do
      local secs = {}
      for sec, n in pairs(kinds[kind]) do
        table.insert(secs, string.format('"%s": %d', sec, n))
      end
      table.insert(parts, string.format('"%s": {%s}', kind, table.concat(secs, ", ")))
    end
    table.insert(tenants, string.format('"%s": {%s}', name, table.concat(parts, ", ")))
  end
  return "{" .. table.concat(tenants, ", ") .. "}"
end

function done(summary, latency, requests)
  local merged = {}
  for _, t in ipairs(threads) do
    local s = t:get("statuses")
    for code, count in pairs(s) do
      merged[code] = (merged[code] or 0) + count
    end
  end
  local parts = {}
  for code, count in pairs(merged) do
    table.insert(parts, string.format('"%d": %d', code, count))
  end
  local e = summary.errors
  io.write(string.format(
    'TRL-WRK {"requests": %d, "duration_us": %d, "bytes": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "timeout": %d, "status": %d}, ' ..
    '"latency_us": {"p50": %d, "p90": %d, "p99": %d, "max": %d, "mean": %.1f}, ' ..
    '"statuses": {%s}, "windows": %s}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.timeout, e.status,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean, table.concat(parts, ", "), windows_json()))
end
