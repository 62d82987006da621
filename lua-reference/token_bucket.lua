-- Token bucket, the Lua twin of RL.TOKENBUCKET.
--
--   EVALSHA <sha> 1 <key> <capacity> <refill_per_sec> [cost]
--
-- Reply: {allowed, remaining, retry_after_ms, reset_after_ms, limit}, errors word for word as
-- the module's. State: hash {tokens, ts (unix microseconds)}, absolute expiry when full again.
-- Every number is computed in the same order as src/core/token_bucket.rs, and numbers passed to
-- redis.call are stored by Redis as "%.17g", which the module writes too: given the same state
-- and the same TIME, both store the same bytes and give the same reply.

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

local function integer_arg(s, lo, hi, not_integer, out_of_range)
  if not is_integer(s) then return nil, not_integer end
  local v = tonumber(s)
  if v >= lo and v <= hi then return v end
  return nil, out_of_range
end

if #KEYS ~= 1 or #ARGV < 2 or #ARGV > 3 then
  return redis.error_reply("ERR wrong number of arguments for 'rl.tokenbucket' command")
end
local key = KEYS[1]

local capacity, err = integer_arg(ARGV[1], 1, MAX_INTEGER_ARG,
  'ERR capacity must be an integer', 'ERR capacity must be between 1 and 1000000000000000')
if not capacity then return redis.error_reply(err) end

if not is_decimal(ARGV[2]) then
  return redis.error_reply('ERR refill_per_sec must be a number')
end
local rate = tonumber(ARGV[2])
if not (rate > 0 and rate <= MAX_RATE_ARG) then
  return redis.error_reply('ERR refill_per_sec must be greater than 0 and at most 1000000000000000')
end

local cost = 1
if ARGV[3] then
  cost, err = integer_arg(ARGV[3], 0, MAX_INTEGER_ARG,
    'ERR cost must be an integer', 'ERR cost must be between 0 and 1000000000000000')
  if not cost then return redis.error_reply(err) end
end

if capacity / rate > MAX_FILL_SECONDS then
  return redis.error_reply('ERR capacity / refill_per_sec must be at most 10000000000 seconds')
end

-- State. pcall keeps Redis's own WRONGTYPE message unchanged.
local fields = redis.pcall('HMGET', key, 'tokens', 'ts')
if fields.err then return fields end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])

local tokens, ts
if not fields[1] and not fields[2] and redis.call('EXISTS', key) == 0 then
  tokens, ts = capacity, now
else
  tokens = fields[1] and is_decimal(fields[1]) and tonumber(fields[1])
  if not (tokens and tokens >= 0 and tokens < math.huge) then
    return redis.error_reply("ERR corrupt rate limiter state: field 'tokens' is not a valid number")
  end
  ts = fields[2] and is_integer(fields[2]) and tonumber(fields[2])
  if not (ts and ts >= 0 and ts <= MAX_TIMESTAMP_US) then
    return redis.error_reply("ERR corrupt rate limiter state: field 'ts' is not a valid timestamp")
  end
end

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

if consumes then
  redis.call('HSET', key, 'tokens', tokens, 'ts', t)
  redis.call('PEXPIREAT', key, math.ceil(t / 1000) + reset_after)
end

return {allowed and 1 or 0, math.floor(tokens), retry_after, reset_after, capacity}
