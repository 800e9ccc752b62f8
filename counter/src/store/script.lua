local P = ARGV[1]
local np = #P / 8
local A
if np <= 4000 then
  A = {struct.unpack('<' .. string.rep('d', np), P)}
else
  A = {}
  local pos, i = 1, 0
  while i < np do
    local c = math.min(np - i, 4000)
    local got = {struct.unpack('<' .. string.rep('d', c), P, pos)}
    for j = 1, c do A[i + j] = got[j] end
    pos = got[c + 1]
    i = i + c
  end
end
local nk = A[1]
local v = {}
for i = 1, nk, 1000 do
  local got = redis.call('MGET', unpack(KEYS, i, math.min(i + 999, nk)))
  for j = 1, #got do v[i + j - 1] = tonumber(got[j]) or 0 end
end
local out = {}
local add = {}
for i = 1, nk do out[i] = v[i] end
local a = 3 + nk
for q = 1, A[2] do
  local n = A[a]; local m = A[a + 1]; a = a + 2
  local ok = 1
  for i = 1, n do
    local limit = A[a]; local hits = A[a + 1]
    local est = v[A[a + 2]]
    local pk = A[a + 3]
    if pk > 0 and v[pk] > 0 then
      est = est + math.floor((v[pk] * A[a + 4] + 999999) / 1000000)
    end
    if (hits == 0 and est >= limit) or (hits > 0 and est + hits > limit) then ok = 0 end
    a = a + 5
  end
  if ok == 1 then
    for i = 1, m do
      local k = A[a]; local hits = A[a + 1]
      v[k] = v[k] + hits
      add[k] = (add[k] or 0) + hits
      a = a + 2
    end
  else
    a = a + 2 * m
  end
  out[nk + q] = ok
end
for k = 1, nk do
  local hits = add[k]
  if hits then
    if out[k] == 0 then
      redis.call('SET', KEYS[k], hits, 'PX', A[2 + k])
    else
      redis.call('INCRBY', KEYS[k], hits)
    end
  end
end
return out
