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
end

function request()
  next_i = next_i % n_order + 1
  return requests[order[next_i]]
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
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
    '"statuses": {%s}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.timeout, e.status,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean, table.concat(parts, ", ")))
end
