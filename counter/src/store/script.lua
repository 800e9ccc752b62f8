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
--
-- Returns {-1} (nothing read, nothing written) when Redis's clock (TIME) is
-- past deadline_ms: the counter has answered the call as failed by then.
-- Else each key's value as first read (key_count numbers; -1 for a key
-- that holds something else than a count: not an integer string in
-- 0 .. 2^53, or not a string), then per request 1 (admitted), 0 (refused)
-- or 2 (failed: one of its keys holds something else than a count, or its
-- hits cannot be counted). A refused or failed request leaves every key as
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
if tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000) > deadline_ms then
  return {-1}
end

local key_count = numbers[2]
local read_count = numbers[3]
local request_count = numbers[4]
local TTL_AT = 4 -- numbers[TTL_AT + k]: key k's ttl_ms

-- value[k]: key k's count now (this call's adds so far included); false
-- for a key that holds something else than a count. first[k]: its count
-- as first read, returned.
local value, first = {}, {}

local function count_of(text)
  local n = tonumber(text)
  if n and n >= 0 and n <= MAX_COUNT and n == math.floor(n) then return n end
  return false
end

-- The keys read first: MGET, 1,000 at a time. A key MGET answers nil for
-- is missing (0) or not a string: one EXISTS over them tells which.
if read_count > 0 then
  local missing = {}
  for from = 1, read_count, 1000 do
    local got = redis.call('MGET', unpack(KEYS, from, math.min(from + 999, read_count)))
    for j = 1, #got do
      local k = from + j - 1
      if got[j] then
        value[k] = count_of(got[j])
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
  for k = 1, read_count do first[k] = value[k] end
end

-- A key no MGET read and no add met yet (a key of a failed request, read
-- by a later one): read now.
local function read(key)
  local got = redis.pcall('GET', KEYS[key])
  local v = 0
  if type(got) == 'table' then
    v = false
  elseif got then
    v = count_of(got)
  end
  value[key] = v
  if first[key] == nil then first[key] = v end
  return v
end

-- A request's adds as made: made[3j-2 .. 3j] = key, hits, count after.
-- before[key]: the key's count before the request's add.
local made, before = {}, {}

-- Undoes the first made_count adds of a request that is not admitted.
local function undo(made_count)
  for j = 1, made_count do
    local key, hits, after = made[3 * j - 2], made[3 * j - 1], made[3 * j]
    if after == hits then
      redis.call('DEL', KEYS[key])
    else
      redis.call('DECRBY', KEYS[key], hits)
    end
    value[key] = after - hits
  end
end

local answer = {}
local at = TTL_AT + key_count + 1
for request = 1, request_count do
  local check_count = numbers[at]
  local add_count = numbers[at + 1]
  local checks_at = at + 2
  local adds_at = checks_at + 5 * check_count
  at = adds_at + 2 * add_count
  local outcome = 1
  local made_count = 0
  for j = 0, add_count - 1 do
    local key = numbers[adds_at + 2 * j]
    local hits = numbers[adds_at + 2 * j + 1]
    if hits >= MAX_HITS then
      -- More hits than any limit: its checks refuse it on the count as it
      -- is, nothing added (a push of as many fails).
      local was = value[key]
      if was == nil then was = read(key) end
      if was == false or check_count == 0 then
        outcome = 2
        break
      end
      before[key] = was
    else
      if value[key] == false then
        outcome = 2
        break
      end
      local after = redis.pcall('INCRBY', KEYS[key], hits)
      if type(after) ~= 'number' then
        -- Not an integer, not a string, or past 2^63: left as it was.
        value[key] = false
        first[key] = false
        outcome = 2
        break
      end
      made_count = made_count + 1
      made[3 * made_count - 2] = key
      made[3 * made_count - 1] = hits
      made[3 * made_count] = after
      local was = after - hits
      if was < 0 or after > MAX_COUNT then
        value[key] = false
        first[key] = false
        outcome = 2
        break
      end
      if first[key] == nil then first[key] = was end
      before[key] = was
      value[key] = after
    end
  end
  -- The checks, on the counts before this request's adds.
  if outcome == 1 then
    for j = 0, check_count - 1 do
      local c = checks_at + 5 * j
      local limit = numbers[c]
      local hits = numbers[c + 1]
      local key = numbers[c + 2]
      local previous_key = numbers[c + 3]
      local estimate = before[key]
      if estimate == nil then
        estimate = value[key]
        if estimate == nil then estimate = read(key) end
      end
      local previous = 0
      if previous_key > 0 then
        previous = value[previous_key]
        if previous == nil then previous = read(previous_key) end
      end
      if estimate == false or previous == false then
        outcome = 2
        break
      end
      if previous > 0 then
        estimate = estimate + math.floor((previous * numbers[c + 4] + 999999) / 1000000)
      end
      if (hits == 0 and estimate >= limit) or (hits > 0 and estimate + hits > limit) then
        outcome = 0
      end
    end
  end
  if outcome == 1 then
    -- A key this request created lives until its window's end.
    for j = 1, made_count do
      if made[3 * j] == made[3 * j - 1] then
        local key = made[3 * j - 2]
        redis.call('PEXPIRE', KEYS[key], numbers[TTL_AT + key])
      end
    end
  else
    undo(made_count)
  end
  for j = 0, add_count - 1 do before[numbers[adds_at + 2 * j]] = nil end
  answer[key_count + request] = outcome
end

for k = 1, key_count do
  local v = first[k]
  if v == false then
    answer[k] = -1
  else
    answer[k] = v or 0
  end
end
return answer
