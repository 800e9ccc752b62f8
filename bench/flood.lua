-- wrk script for the flood of distinct tenants (tests/flood.py, used by
-- tests/test_flood.py and `bench/bench.py --flood N`): every request names
-- a tenant no request before it named.
--
--   wrk -t T -c C -d LONG -s bench/flood.lua URL -- HEADER PREFIX T
--
-- (T again after `--`: a thread's init() runs before the next thread is
-- set up, so the script cannot count them itself.)
--
-- Thread k (1..T) sends PREFIX<k-1>, PREFIX<k-1+T>, PREFIX<k-1+2T>, ...
-- The caller ends the run with SIGINT once Envoy has counted enough
-- requests (wrk's main thread sleeps the whole -d whatever its threads do).
-- done() prints one line `TRL-WRK {json}` like bench/tenants.lua: the
-- totals, wrk's error counts and the status counts summed over every thread.

local threads = {}

function setup(thread)
  thread:set("id", #threads + 1)
  table.insert(threads, thread)
end

local header, prefix, nthreads
local next_k = 0
statuses = {}

function init(args)
  header, prefix = args[1], args[2]
  nthreads = tonumber(args[3])
  if header == nil or prefix == nil or nthreads == nil then
    error("usage: -- HEADER PREFIX THREADS")
  end
end

function request()
  local tenant = prefix .. tostring(id - 1 + next_k * nthreads)
  next_k = next_k + 1
  return wrk.format(nil, nil, { [header] = tenant })
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
