-- wrk script of tests/test_batch.py: requests of several tenants and costs,
-- interleaved, on keep-alive connections.
--
--   wrk -t T -c C -d LONG -s tests/mixed.lua URL -- TENANT_HEADER COST_HEADER TENANT:COST ...
--
-- Each thread cycles through the TENANT:COST pairs, in order. The caller
-- ends the run with SIGINT once Envoy has decided enough requests.

local tenant_header, cost_header
local pairs_ = {}
local next_i = 0

function init(args)
  tenant_header, cost_header = args[1], args[2]
  for i = 3, #args do
    local tenant, cost = string.match(args[i], "^(.+):(%d+)$")
    if tenant == nil then
      error("usage: -- TENANT_HEADER COST_HEADER TENANT:COST ...")
    end
    table.insert(pairs_, { [tenant_header] = tenant, [cost_header] = cost })
  end
  if #pairs_ == 0 then
    error("usage: -- TENANT_HEADER COST_HEADER TENANT:COST ...")
  end
end

function request()
  next_i = next_i % #pairs_ + 1
  return wrk.format(nil, nil, pairs_[next_i])
end
