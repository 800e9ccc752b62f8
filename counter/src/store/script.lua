-- ratelimit-counter's decision for one call's requests, in one step.
--
-- KEYS[1 .. key_count]: the call's distinct counter keys, each once.
-- ARGV[1]: every number the script needs, packed as little-endian doubles
--   (exact below 2^53; Redis parses one argument, struct.unpack reads it in
--   C, at most 4,000 at a time), in this order:
--     key_count, request_count,
--     ttl_ms of each key (key_count numbers: the expiry of a key this call
--       creates),
--     then per request:
--       check_count, add_count,
--       per check: limit, hits, key_index, previous_key_index (0: none),
--         previous_weight_ppm (the previous window's weight, millionths),
--       per add: key_index, hits.
--   A key_index is a position in KEYS. A push is a request of no checks:
--   admitted, its hits added.
-- Returns each key's value as read (key_count numbers), then per request 1
-- (admitted) or 0 (refused). A refused request writes nothing; the keys
-- the admitted ones add to are written once each, their hits summed.

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

local key_count = numbers[1]
local request_count = numbers[2]
local TTL_AT = 2 -- numbers[TTL_AT + k]: key k's ttl_ms

-- Every key read once (MGET, 1,000 keys at a time); a missing key is 0.
local value = {}
for first = 1, key_count, 1000 do
  local got = redis.call('MGET', unpack(KEYS, first, math.min(first + 999, key_count)))
  for j = 1, #got do value[first + j - 1] = tonumber(got[j]) or 0 end
end

local answer = {}
for k = 1, key_count do answer[k] = value[k] end
local added = {}

-- Each request in order, on the values as the requests before it left them.
local at = 3 + key_count
for request = 1, request_count do
  local check_count = numbers[at]
  local add_count = numbers[at + 1]
  at = at + 2
  local admitted = 1
  for _ = 1, check_count do
    local limit = numbers[at]
    local hits = numbers[at + 1]
    local key = numbers[at + 2]
    local previous_key = numbers[at + 3]
    local previous_weight_ppm = numbers[at + 4]
    local estimate = value[key]
    if previous_key > 0 and value[previous_key] > 0 then
      estimate = estimate
        + math.floor((value[previous_key] * previous_weight_ppm + 999999) / 1000000)
    end
    if (hits == 0 and estimate >= limit) or (hits > 0 and estimate + hits > limit) then
      admitted = 0
    end
    at = at + 5
  end
  if admitted == 1 then
    for _ = 1, add_count do
      local key = numbers[at]
      local hits = numbers[at + 1]
      value[key] = value[key] + hits
      added[key] = (added[key] or 0) + hits
      at = at + 2
    end
  else
    at = at + 2 * add_count
  end
  answer[key_count + request] = admitted
end

-- Each key written once: created with its expiry (its window's first
-- hits), else added to.
for key = 1, key_count do
  local hits = added[key]
  if hits then
    if answer[key] == 0 then
      redis.call('SET', KEYS[key], hits, 'PX', numbers[TTL_AT + key])
    else
      redis.call('INCRBY', KEYS[key], hits)
    end
  end
end
return answer
