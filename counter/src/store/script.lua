-- ratelimit-counter's decision for one call's requests, in one step.
--
-- KEYS[1 .. key_count]: the call's distinct counter keys, each once; the
--   first read_count of them are read before any request is decided (a
--   key whose first use in the call is a read: a sliding window's previous
--   counter, a check of 0 hits); the others are first met by an add.
-- ARGV[1]: every number the script needs, packed as little-endian doubles
--   (exact below 2^53; Redis parses one argument, struct.unpack reads it in
--   C, at most 4,000 at a time), in this order:
--     deadline_ms (the call's deadline on the counter's clock, Unix ms),
--     key_count, read_count, request_count,
--     ttl_ms of each key (key_count numbers: the expiry of a key this call
--       creates),
--     then per request:
--       check_count, add_count,
--       per check: limit, hits, key_index, previous_key_index (0: none),
--         previous_weight_ppm (the previous window's weight, millionths),
--       per add: key_index, hits.
--   A key_index is a position in KEYS. A push is a request of no checks:
--   admitted, its hits added.
--   Then, only on a regional counter (ratelimit-counter --region) and only
--   for a call with a global group's checks: regional_count, and per
--   regional check: its request, its place among the request's checks
--   (from 1), the KEYS index of its tenant's regions hash (past
--   key_count), its floor. KEYS[key_count + 1] is then the registry of
--   regions hashes (a sorted set). Such a check is decided against the
--   hash's alloc (its floor when none; at most its limit) instead of its
--   limit; its request's hits are added to the hash's admitted or refused
--   (the region's demand), the hash's limit written, and the hash scored
--   in the registry with Redis's time.
--
-- Returns {-1} (nothing read, nothing written) when Redis's clock (TIME) is
-- past deadline_ms: the counter has answered the call as failed by then.
-- Else each key's value as first read (key_count numbers; -1 for a key
-- that holds something else than a count: not an integer string in
-- 0 .. 2^53, or not a string), then per request 1 (admitted), 0 (refused)
-- or 2 (failed: one of its keys holds something else than a count, or its
-- hits cannot be counted), then per regional check the allocation it was
-- decided against (-1: not decided). A refused or failed request leaves every key as
-- it found it; nothing this script writes is anything but an integer.
--
-- Each add is an INCRBY (its answer is the count before the add, plus the
-- hits): a request's adds are made first, its checks decided on the counts
-- before them, and a refused request's adds undone (DECRBY, or DEL of a key
-- it created). A key an admitted request created gets its expiry (PEXPIRE).

local MAX_COUNT = 9007199254740991 -- 2^53 - 1: exact in a double
local MAX_HITS = 1e14 -- below it, a number is sent to Redis as digits

local packed = ARGV[1]
local number_count = #packed / 8
local numbers
if number_count <= 4000 then
  numbers = {struct.unpack('<' .. string.rep('d', number_count), packed)}
else
  numbers = {}
  local byte_at, done = 1, 0
  while done < number_count do
    local chunk = math.min(number_count - done, 4000)
    local got = {struct.unpack('<' .. string.rep('d', chunk), packed, byte_at)}
    for j = 1, chunk do numbers[done + j] = got[j] end
    byte_at = got[chunk + 1]
    done = done + chunk
  end
end

local deadline_ms = numbers[1]
local time = redis.call('TIME')
local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if now_ms > deadline_ms then
  return {-1}
end

local key_count = numbers[2]
local read_count = numbers[3]
local request_count = numbers[4]
local TTL_AT = 4 -- numbers[TTL_AT + k]: key k's ttl_ms

-- value[k]: key k's count now (this call's adds so far included); false
-- for a key that holds something else than a count. answer[k]: its count
-- as first read (-1: not a count), returned.
local value, answer = {}, {}

-- The keys read first: MGET, 1,000 at a time. A key MGET answers nil for
-- is missing (0) or not a string: one EXISTS over them tells which.
if read_count > 0 then
  local missing = {}
  for from = 1, read_count, 1000 do
    local got = redis.call('MGET', unpack(KEYS, from, math.min(from + 999, read_count)))
    for j = 1, #got do
      local k = from + j - 1
      if got[j] then
        local n = tonumber(got[j])
        if n and n >= 0 and n <= MAX_COUNT and n == math.floor(n) then
          value[k] = n
        else
          value[k] = false
        end
      else
        value[k] = 0
        missing[#missing + 1] = k
      end
    end
  end
  if #missing > 0 then
    local names = {}
    for j = 1, #missing do names[j] = KEYS[missing[j]] end
    if redis.call('EXISTS', unpack(names)) > 0 then
      for j = 1, #missing do
        if redis.call('EXISTS', names[j]) == 1 then value[missing[j]] = false end
      end
    end
  end
  for k = 1, read_count do
    if value[k] == false then answer[k] = -1 else answer[k] = value[k] end
  end
end

-- A key no MGET read and no add met yet (a key of a failed request, read
-- by a later one): read now.
local function read(key)
  local got = redis.pcall('GET', KEYS[key])
  local v = 0
  if type(got) == 'table' then
    v = false
  elseif got then
    v = tonumber(got)
    if not (v and v >= 0 and v <= MAX_COUNT and v == math.floor(v)) then v = false end
  end
  value[key] = v
  if answer[key] == nil then
    if v == false then answer[key] = -1 else answer[key] = v end
  end
  return v
end

-- The regional checks, after the requests: regional[request][place].
local regional, regional_count, decided_against = {}, 0, {}
if #KEYS > key_count then
  local walk = TTL_AT + key_count + 1
  for request = 1, request_count do
    walk = walk + 2 + 5 * numbers[walk] + 2 * numbers[walk + 1]
  end
  if walk <= number_count then
    regional_count = numbers[walk]
    for e = 1, regional_count do
      local b = walk + 1 + 4 * (e - 1)
      local r = numbers[b]
      if not regional[r] then regional[r] = {} end
      regional[r][numbers[b + 1]] = {hash = numbers[b + 2], floor = numbers[b + 3], entry = e}
    end
  end
end

local at = TTL_AT + key_count + 1
for request = 1, request_count do
  local check_count = numbers[at]
  local add_count = numbers[at + 1]
  local checks_at = at + 2
  local adds_at = checks_at + 5 * check_count
  at = adds_at + 2 * add_count
  local outcome = 1
  -- The adds first, each key once (value[key]: the count after it): a
  -- check of this request on a key it adds to is decided on the count
  -- less its hits. The adds at adds_at .. made_end were made (those of
  -- fewer than MAX_HITS).
  local made_end, huge = adds_at - 2, false
  for j = adds_at, adds_at + 2 * add_count - 2, 2 do
    local key, hits = numbers[j], numbers[j + 1]
    if hits >= MAX_HITS then
      -- More hits than any limit: its checks refuse it on the count as it
      -- is, nothing added to it (a push of as many fails).
      local was = value[key]
      if was == nil then was = read(key) end
      if was == false or check_count == 0 then
        outcome = 2
        break
      end
      huge = true
    else
      if value[key] == false then
        outcome = 2
        break
      end
      local after = redis.pcall('INCRBY', KEYS[key], hits)
      if type(after) ~= 'number' then
        -- Not an integer, not a string, or past 2^63: left as it was.
        value[key] = false
        answer[key] = -1
        outcome = 2
        break
      end
      made_end = j
      value[key] = after
      if after - hits < 0 or after > MAX_COUNT then
        -- Undone below, and marked.
        outcome = 2
        break
      end
      if answer[key] == nil then answer[key] = after - hits end
    end
  end
  -- The checks, on the counts before this request's adds.
  if outcome == 1 then
    for c = checks_at, checks_at + 5 * check_count - 5, 5 do
      local limit, hits, key, previous_key = numbers[c], numbers[c + 1], numbers[c + 2], numbers[c + 3]
      local reg = regional[request] and regional[request][(c - checks_at) / 5 + 1]
      if reg then
        -- A global group's check: against the region's allocation.
        local held = tonumber(redis.call('HGET', KEYS[reg.hash], 'alloc'))
        if not held or held ~= held then held = reg.floor end
        if held > limit then held = limit end
        if held < 0 then held = 0 end
        limit = held
        decided_against[reg.entry] = held
      end
      local estimate = value[key]
      if estimate == nil then estimate = read(key) end
      local previous = 0
      if previous_key > 0 then
        previous = value[previous_key]
        if previous == nil then previous = read(previous_key) end
      end
      if estimate == false or previous == false then
        outcome = 2
        break
      end
      if hits > 0 then estimate = estimate - hits end
      if previous > 0 then
        estimate = estimate + math.floor((previous * numbers[c + 4] + 999999) / 1000000)
      end
      if (hits == 0 and estimate >= limit) or (hits > 0 and estimate + hits > limit) then
        outcome = 0
      end
    end
    if huge and outcome == 1 then outcome = 0 end
  end
  if outcome == 1 then
    -- A key this request created lives until its window's end.
    for j = adds_at, made_end, 2 do
      local key = numbers[j]
      if value[key] == numbers[j + 1] then
        redis.call('PEXPIRE', KEYS[key], numbers[TTL_AT + key])
      end
    end
  else
    -- Its adds undone: DECRBY, or DEL of a key it created.
    for j = adds_at, made_end, 2 do
      local key, hits = numbers[j], numbers[j + 1]
      local after = value[key]
      if hits >= MAX_HITS then
        -- Not added.
      elseif after == hits then
        redis.call('DEL', KEYS[key])
      else
        redis.call('DECRBY', KEYS[key], hits)
      end
      if hits >= MAX_HITS then
        -- Not added.
      elseif after - hits < 0 or after > MAX_COUNT then
        value[key] = false
        answer[key] = -1
      else
        value[key] = after - hits
      end
    end
  end
  answer[key_count + request] = outcome
  if regional[request] and outcome ~= 2 then
    -- The region's demand: what it admitted and refused.
    for place, reg in pairs(regional[request]) do
      local c = checks_at + 5 * (place - 1)
      local hash = KEYS[reg.hash]
      local hits = numbers[c + 1]
      if hits > 0 and hits < MAX_HITS then
        redis.call('HINCRBY', hash, outcome == 1 and 'admitted' or 'refused', hits)
      end
      redis.call('HSET', hash, 'limit', numbers[c])
      redis.call('ZADD', KEYS[key_count + 1], now_ms, hash)
    end
  end
end

for k = 1, key_count do
  if answer[k] == nil then answer[k] = 0 end
end
for e = 1, regional_count do
  answer[key_count + request_count + e] = decided_against[e] or -1
end
return answer
