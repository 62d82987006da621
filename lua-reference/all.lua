-- Several limits at once, the Lua twin of RL.ALL.
--
--   EVALSHA <sha> <numkeys> <key> [key ...] <ALGORITHM> <params...> [...] [COST <cost>]
--
-- The n-th limit applies to the n-th key. Admitted only if every limit admits, consuming from all
-- or none. Reply: {allowed, denied_by, {reply of limit 1}, {reply of limit 2}, ...}, where
-- denied_by is the 1-based position of the first limit that denied (0 when admitted); a limit
-- that would admit while another denies reports its unconsumed state (as with cost 0).
--
-- The @common and @limiter blocks below are copies of the per-algorithm scripts' blocks;
-- tests/lua_blocks.rs checks that they are identical (UPDATE_LUA=1 cargo test --test lua_blocks
-- rewrites them).

-- @common
local MAX_INTEGER_ARG = 1e15
local MAX_RATE_ARG = 1e15
local MAX_FILL_SECONDS = 1e10
local MAX_TIMESTAMP_US = 9007199254740992

local function is_integer(s)
  return string.match(s, '^[+-]?%d+$') ~= nil
end

local function is_decimal(s)
  local mantissa = s
  local e = string.find(s, '[eE]')
  if e then
    if not is_integer(string.sub(s, e + 1)) then return false end
    mantissa = string.sub(s, 1, e - 1)
  end
  return string.match(mantissa, '^[+-]?%d+%.?%d*$') ~= nil
      or string.match(mantissa, '^[+-]?%.%d+$') ~= nil
end

-- An integer argument in [lo, hi], or nil and the error message.
local function integer_arg(s, lo, hi, not_integer, out_of_range)
  if not is_integer(s) then return nil, not_integer end
  local v = tonumber(s)
  if v >= lo and v <= hi then return v end
  return nil, out_of_range
end

-- A rate argument in (0, MAX_RATE_ARG], or nil and the error message.
local function rate_arg(s, not_number, out_of_range)
  if not is_decimal(s) then return nil, not_number end
  local v = tonumber(s)
  if v > 0 and v <= MAX_RATE_ARG then return v end
  return nil, out_of_range
end

local function cost_arg(s)
  if s == nil then return 1 end
  return integer_arg(s, 0, MAX_INTEGER_ARG,
    'ERR cost must be an integer', 'ERR cost must be between 0 and 1000000000000000')
end

-- Stored numbers: a finite non-negative decimal, an integer timestamp in [0, 2^53].
local function stored_amount(s)
  local v = s and is_decimal(s) and tonumber(s)
  if v and v >= 0 and v < math.huge then return v end
  return nil
end

local function stored_timestamp(s)
  local v = s and is_integer(s) and tonumber(s)
  if v and v >= 0 and v <= MAX_TIMESTAMP_US then return v end
  return nil
end

-- The fields of a hash-backed limiter: false for a missing key, nil and an error reply for a key
-- of another type (Redis's own WRONGTYPE), else the list of values (false where absent).
local function load_hash(key, ...)
  local fields = redis.pcall('HMGET', key, ...)
  if fields.err then return nil, fields end
  for i = 1, select('#', ...) do
    if fields[i] then return fields end
  end
  if redis.call('EXISTS', key) == 0 then return false end
  return fields
end

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- @end

-- @limiter token_bucket
local token_bucket = {
  ARITY = "ERR wrong number of arguments for 'rl.tokenbucket' command",
}

function token_bucket.parse(argv)
  if #argv < 2 or #argv > 3 then return nil, token_bucket.ARITY end
  local capacity, rate, cost, err
  capacity, err = integer_arg(argv[1], 1, MAX_INTEGER_ARG,
    'ERR capacity must be an integer', 'ERR capacity must be between 1 and 1000000000000000')
  if not capacity then return nil, err end
  rate, err = rate_arg(argv[2], 'ERR refill_per_sec must be a number',
    'ERR refill_per_sec must be greater than 0 and at most 1000000000000000')
  if not rate then return nil, err end
  cost, err = cost_arg(argv[3])
  if not cost then return nil, err end
  if capacity / rate > MAX_FILL_SECONDS then
    return nil, 'ERR capacity / refill_per_sec must be at most 10000000000 seconds'
  end
  return {capacity = capacity, rate = rate, cost = cost}
end

-- false for a new bucket, the state, or nil and an error reply.
function token_bucket.load(key)
  local fields, err = load_hash(key, 'tokens', 'ts')
  if not fields then return fields, err end
  local tokens = stored_amount(fields[1])
  if not tokens then
    return nil, redis.error_reply("ERR corrupt rate limiter state: field 'tokens' is not a valid number")
  end
  local ts = stored_timestamp(fields[2])
  if not ts then
    return nil, redis.error_reply("ERR corrupt rate limiter state: field 'ts' is not a valid timestamp")
  end
  return {tokens = tokens, ts = ts}
end

-- The reply, and what to store (nil when nothing is written).
function token_bucket.decide(a, state, now)
  local capacity, rate, cost = a.capacity, a.rate, a.cost
  local tokens, ts = capacity, now
  if state then tokens, ts = state.tokens, state.ts end
  -- A clock that went backwards refills nothing and never moves the stored time back.
  local elapsed = now - ts
  if elapsed < 0 then elapsed = 0 end
  local t = now
  if ts > now then t = ts end
  tokens = tokens + elapsed * rate / 1000000
  if tokens > capacity then tokens = capacity end

  local allowed = cost <= tokens
  local consumes = allowed and cost > 0
  if consumes then tokens = tokens - cost end

  local retry_after
  if allowed then
    retry_after = 0
  elseif cost > capacity then
    retry_after = -1
  else
    retry_after = math.ceil((cost - tokens) * 1000 / rate)
  end
  local reset_after = math.ceil((capacity - tokens) * 1000 / rate)

  local write
  if consumes then
    write = {tokens = tokens, ts = t, expire_at = math.ceil(t / 1000) + reset_after}
  end
  return {allowed and 1 or 0, math.floor(tokens), retry_after, reset_after, capacity}, write
end

function token_bucket.store(key, w)
  redis.call('HSET', key, 'tokens', w.tokens, 'ts', w.ts)
  redis.call('PEXPIREAT', key, w.expire_at)
end
-- @end

-- @main
local ALGORITHMS = {
  {keyword = 'TOKENBUCKET', params = 2, limiter = token_bucket},
}
local ARITY = "ERR wrong number of arguments for 'rl.all' command"
local n = #KEYS
-- The shortest call is `numkeys key ALGORITHM p1 p2` (Redis checks RL.ALL's arity the same way).
if n + #ARGV < 4 then return redis.error_reply(ARITY) end
if n < 1 or n > 16 then
  return redis.error_reply('ERR numkeys must be an integer between 1 and 16')
end

local words = {}
for i = 1, #ARGV do words[i] = ARGV[i] end
local cost = '1'
if #words >= 2 and string.upper(words[#words - 1]) == 'COST' then
  cost = words[#words]
  words[#words] = nil
  words[#words] = nil
end

local limits = {}
local i = 1
while i <= #words do
  local algorithm
  local keyword = string.upper(words[i])
  for _, a in ipairs(ALGORITHMS) do
    if a.keyword == keyword then algorithm = a end
  end
  if not algorithm then
    return redis.error_reply('ERR unknown algorithm, expected one of: TOKENBUCKET')
  end
  if #words - i < algorithm.params then return redis.error_reply(ARITY) end
  local params = {}
  for j = 1, algorithm.params do params[j] = words[i + j] end
  params[algorithm.params + 1] = '0'
  local peek_args, err = algorithm.limiter.parse(params)
  if not peek_args then return redis.error_reply(err) end
  params[algorithm.params + 1] = cost
  local args
  args, err = algorithm.limiter.parse(params)
  if not args then return redis.error_reply(err) end
  limits[#limits + 1] = {limiter = algorithm.limiter, args = args, peek_args = peek_args}
  i = i + 1 + algorithm.params
end
if #limits ~= n then
  return redis.error_reply('ERR the number of limits must equal numkeys')
end
for a = 1, n do
  for b = a + 1, n do
    if KEYS[a] == KEYS[b] then return redis.error_reply('ERR each limit needs its own key') end
  end
end

for k, limit in ipairs(limits) do
  local state, load_err = limit.limiter.load(KEYS[k])
  if state == nil then return load_err end
  limit.state = state
end

local now = now_us()
local replies, denied_by = {}, 0
for k, limit in ipairs(limits) do
  replies[k], limit.write = limit.limiter.decide(limit.args, limit.state, now)
  if denied_by == 0 and replies[k][1] == 0 then denied_by = k end
end
if denied_by == 0 then
  for k, limit in ipairs(limits) do
    if limit.write then limit.limiter.store(KEYS[k], limit.write) end
  end
else
  for k, limit in ipairs(limits) do
    if replies[k][1] == 1 then replies[k] = limit.limiter.decide(limit.peek_args, limit.state, now) end
  end
end

local reply = {denied_by == 0 and 1 or 0, denied_by}
for k = 1, n do reply[k + 2] = replies[k] end
return reply
