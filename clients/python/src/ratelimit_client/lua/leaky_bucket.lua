-- Leaky bucket (policing), the Lua twin of RL.LEAKYBUCKET.
--
--   EVALSHA <sha> 1 <key> <capacity> <leak_per_sec> [cost]
--
-- Reply: {allowed, remaining, retry_after_ms, reset_after_ms, limit}, errors word for word as
-- the module's. State: one string "<level> <ts>" (ts in unix microseconds), absolute expiry when
-- empty again. Every number is computed in the same order as src/core/leaky_bucket.rs and stored
-- as "%.17g", as the module writes it.
--
-- Layout shared by every script here: a "common" block (identical in all of them), one "limiter"
-- block with parse / load / decide / store, and a short "main".

-- @common
local MAX_INTEGER_ARG = 1e15
local MAX_RATE_ARG = 1e15
local MAX_FILL_SECONDS = 1e10
local MAX_TIMESTAMP_US = 9007199254740992
-- How far ahead of this server's clock a stored time may be and still be read (a master whose
-- clock ran ahead of this one's wrote it); further ahead, no call wrote it (src/codec/stored.rs).
local SKEW_US = 60000000
-- The most a count reaches: a settlement charges a window up to twice the largest limit.
local MAX_COUNT = 2e15
-- The fewest old entries a sorted-set write removes when there are that many (src/core/mod.rs).
local TRIM_AT_LEAST = 128
-- The kinds of state with a tag, the first word of the value, and the command that writes each
-- (src/store/kind.rs).
local KINDS = {tb = 'RL.TOKENBUCKET', lb = 'RL.LEAKYBUCKET', fw = 'RL.FIXEDWINDOW',
               sw = 'RL.SLIDINGWINDOW', gcra = 'RL.GCRA'}

-- The error a call answers on a key that another kind of limiter wrote.
local function foreign(holder, caller)
  return redis.error_reply('WRONGTYPE the key holds ' .. holder .. ' state, not ' .. caller .. ' state')
end

-- The longest number the grammar accepts, in bytes: a longer string is not a number, refused
-- before any of it is read (src/codec/number.rs).
local MAX_NUMBER_LEN = 64

local function is_integer(s)
  if #s > MAX_NUMBER_LEN then return false end
  return string.match(s, '^[+-]?%d+$') ~= nil
end

local function is_decimal(s)
  if #s > MAX_NUMBER_LEN then return false end
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

-- Stored numbers: a non-negative decimal up to MAX_COUNT, an integer timestamp in [0, 2^53].
local function stored_amount(s)
  local v = s and is_decimal(s) and tonumber(s)
  if v and v >= 0 and v <= MAX_COUNT then return v end
  return nil
end

-- A token bucket's tokens: a decimal of either sign within the largest capacity (negative for a
-- debt, RL.SETTLE).
local function stored_balance(s)
  local v = s and is_decimal(s) and tonumber(s)
  if v and v >= -MAX_INTEGER_ARG and v <= MAX_INTEGER_ARG then return v end
  return nil
end

local function stored_timestamp(s)
  local v = s and is_integer(s) and tonumber(s)
  if v and v >= 0 and v <= MAX_TIMESTAMP_US then return v end
  return nil
end

-- A stored time of a limiter that never stores one ahead of its clock, as a call at `now` reads
-- it: as it is up to SKEW_US ahead (the limiter carries on from it), nil (corrupt) further ahead.
local function within_skew(t, now)
  if t > now + SKEW_US then return nil end
  return t
end

-- How many old entries a sorted-set write that adds `added` removes, of the `old` there are.
local function trim_count(old, added)
  local most = TRIM_AT_LEAST
  if added > most then most = added end
  if old < most then
    if old < 0 then return 0 end
    return old
  end
  return most
end

-- The numbers of a limiter's state: false for a missing key, nil and an error reply for a key
-- of another type (Redis's own WRONGTYPE) or of another kind of limiter, else the list of values
-- (false where absent). The state is one string: the limiter's tag, then its numbers, separated
-- by single spaces and split at the first n - 1 of them (the last part keeps the rest); a value
-- without a tag was written before tags, and is read as the caller's. A hash with one field per
-- number, the layout of release 0.1, is read too (one with other fields is not); the next write
-- replaces it with the string.
local FIELDS_SPLIT = {'^(.*)$', '^([^ ]*) (.*)$', '^([^ ]*) ([^ ]*) (.*)$'}
local function load_fields(key, tag, ...)
  local n = select('#', ...)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' then
    if redis.call('TYPE', key)['ok'] ~= 'hash' then return nil, v end
    if redis.call('HLEN', key) > n then
      return nil, redis.error_reply('WRONGTYPE the key holds a hash with fields no rate limiter writes')
    end
    return redis.call('HMGET', key, ...)
  end
  if not v then return false end
  local word, rest = string.match(v, '^(%l+) (.*)$')
  if not word then word, rest = string.match(v, '^(%l+)$'), '' end
  if word and KINDS[word] then
    if word ~= tag then return nil, foreign(KINDS[word], KINDS[tag]) end
    v = rest
  end
  local whole = {string.match(v, FIELDS_SPLIT[n])}
  if #whole == n then return whole end
  -- Fewer parts than numbers: the ones there, then false.
  local fields, from = {}, 1
  for i = 1, n - 1 do
    local space = string.find(v, ' ', from, true)
    if not space then break end
    fields[i] = string.sub(v, from, space - 1)
    from = space + 1
  end
  fields[#fields + 1] = string.sub(v, from)
  for i = #fields + 1, n do fields[i] = false end
  return fields
end

-- Stores the tag and the numbers as that one string, each number as '%.17g' (C's formatting,
-- the same on every server), with an absolute expiry in milliseconds: a single SET. The expiry is
-- an integer, which every server passes on as its digits.
local FIELDS_FORMAT = {'%.17g', '%.17g %.17g', '%.17g %.17g %.17g'}
local function store_fields(key, expire_at, tag, ...)
  redis.call('SET', key, tag .. ' ' .. string.format(FIELDS_FORMAT[select('#', ...)], ...),
    'PXAT', expire_at)
end

-- A settlement's reply (RL.SETTLE): the state after, as a peek reports it, admitted and with
-- nothing to wait for.
local function settled(reply)
  reply[1], reply[3] = 1, 0
  return reply
end

-- A limiter's arguments after the key, ending with a cost or with UPTO n in its place: a partial
-- grant, parsed with a cost of 1 there (so that a call with both has one argument too many), n
-- at most the limiter's UPTO_MAX (its cost's largest).
local function parse_call(limiter, argv)
  local n = #argv
  if n >= 2 and #argv[n - 1] == 4 and string.upper(argv[n - 1]) == 'UPTO' then
    local upto, err = integer_arg(argv[n], 1, limiter.UPTO_MAX or MAX_INTEGER_ARG,
      'ERR UPTO must be an integer',
      limiter.UPTO_RANGE or 'ERR UPTO must be between 1 and 1000000000000000')
    if not upto then return nil, err end
    -- UPTO n stands in for the cost, never for a parameter.
    if n - 2 ~= limiter.PARAMS then return nil, limiter.ARITY end
    local params = {}
    for i = 1, n - 2 do params[i] = argv[i] end
    params[n - 1] = '1'
    local a, perr = limiter.parse(params)
    if a then a.upto = upto end
    return a, perr
  end
  return limiter.parse(argv)
end

-- A call's decision (the reply, and what to store), as the limiter decides its cost; a partial
-- grant (a.upto) as consumptions, the way the module's store::grant decides it: what a peek
-- leaves (g, at most n), then g - 1, then 1, each once; the first that admits carries the count
-- granted sixth, and when none does the reply is the denial of a cost of 1, granted 0.
local function decide_call(limiter, a, state, now, key)
  local n = a.upto
  if not n then return limiter.decide(a, state, now, key) end
  a.cost = 0
  local reply, write = limiter.decide(a, state, now, key)
  if not reply then return reply, write end
  -- The remaining count as the reply sends it: a whole number (a count may have a fraction).
  local g = math.floor(reply[2])
  if g > n then g = n end
  local tried = 0
  for _, t in ipairs({g, g - 1, 1}) do
    if t >= 1 and t ~= tried then
      tried = t
      a.cost = t
      reply, write = limiter.decide(a, state, now, key)
      if not reply then return reply, write end
      if reply[1] == 1 then
        reply[6] = t
        return reply, write
      end
    end
  end
  reply[6] = 0
  return reply, write
end

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- @end

-- @limiter leaky_bucket
local leaky_bucket = {
  ARITY = "ERR wrong number of arguments for 'rl.leakybucket' command",
  -- The parameters between the key and the cost.
  PARAMS = 2,
}

function leaky_bucket.parse(argv)
  if #argv < 2 or #argv > 3 then return nil, leaky_bucket.ARITY end
  local capacity, rate, cost, err
  capacity, err = integer_arg(argv[1], 1, MAX_INTEGER_ARG,
    'ERR capacity must be an integer', 'ERR capacity must be between 1 and 1000000000000000')
  if not capacity then return nil, err end
  rate, err = rate_arg(argv[2], 'ERR leak_per_sec must be a number',
    'ERR leak_per_sec must be greater than 0 and at most 1000000000000000')
  if not rate then return nil, err end
  cost, err = cost_arg(argv[3])
  if not cost then return nil, err end
  if capacity / rate > MAX_FILL_SECONDS then
    return nil, 'ERR capacity / leak_per_sec must be at most 10000000000 seconds'
  end
  return {capacity = capacity, rate = rate, cost = cost}
end

-- false for a new bucket, the state, or nil and an error reply.
function leaky_bucket.load(key, _, now)
  local fields, err = load_fields(key, 'lb', 'level', 'ts')
  if not fields then return fields, err end
  local level = stored_amount(fields[1])
  if not level then
    return nil, redis.error_reply("ERR corrupt rate limiter state: field 'level' is not a valid number")
  end
  local ts = stored_timestamp(fields[2])
  if not ts then
    return nil, redis.error_reply("ERR corrupt rate limiter state: field 'ts' is not a valid timestamp")
  end
  ts = within_skew(ts, now)
  if not ts then
    return nil, redis.error_reply("ERR corrupt rate limiter state: field 'ts' is ahead of the server's clock by more than 60 seconds")
  end
  return {level = level, ts = ts}
end

-- The level as of now, and the time to store with it. A level above capacity (a charge, or a
-- capacity argument that was lowered) drains like any other, counted at most twice the capacity.
function leaky_bucket.current(a, state, now)
  local level, ts = 0, now
  if state then level, ts = state.level, state.ts end
  -- A debt is at most one capacity, cut to it as of the stored time, before it drains.
  if level > 2 * a.capacity then level = 2 * a.capacity end
  -- A clock that went backwards drains nothing and never moves the stored time back.
  local elapsed = now - ts
  if elapsed < 0 then elapsed = 0 end
  local t = now
  if ts > now then t = ts end
  level = level - elapsed * a.rate / 1000000
  if level < 0 then level = 0 end
  return level, t
end

function leaky_bucket.write(a, level, t)
  local reset_after = math.ceil(level * 1000 / a.rate)
  return {level = level, ts = t, expire_at = math.ceil(t / 1000) + reset_after}
end

-- RL.SETTLE: delta units refunded (negative, never below 0) or charged (positive, up to twice
-- the capacity) without an admission check. The reply, and what to store (nil when nothing changes).
function leaky_bucket.settle(a, state, now, delta)
  if delta == 0 or (delta < 0 and not state) then return settled(leaky_bucket.decide(a, state, now)) end
  local level, t = leaky_bucket.current(a, state, now)
  level = level + delta
  if level < 0 then level = 0 end
  if level > 2 * a.capacity then level = 2 * a.capacity end
  local w = leaky_bucket.write(a, level, t)
  return settled(leaky_bucket.decide(a, w, now)), w
end

-- The reply, and what to store (nil when nothing is written).
function leaky_bucket.decide(a, state, now)
  local capacity, rate, cost = a.capacity, a.rate, a.cost
  local level, t = leaky_bucket.current(a, state, now)

  local allowed = level + cost <= capacity
  local consumes = allowed and cost > 0
  if consumes then level = level + cost end

  -- Milliseconds until draining starts: 0, or as long as a stored time lies ahead of now.
  local ahead = (t - now) / 1000
  local retry_after
  if allowed then
    retry_after = 0
  elseif cost > capacity then
    retry_after = -1
  else
    retry_after = math.ceil(ahead + (level + cost - capacity) * 1000 / rate)
  end
  local reset_after = math.ceil(ahead + level * 1000 / rate)
  -- A level above capacity leaves nothing, not less.
  local remaining = math.floor(capacity - level)
  if remaining < 0 then remaining = 0 end

  local write
  if consumes then write = leaky_bucket.write(a, level, t) end
  return {allowed and 1 or 0, remaining, retry_after, reset_after, capacity}, write
end

function leaky_bucket.store(key, w)
  store_fields(key, w.expire_at, 'lb', w.level, w.ts)
end
-- @end

-- @main
if #KEYS ~= 1 then return redis.error_reply(leaky_bucket.ARITY) end
local args, err = parse_call(leaky_bucket, ARGV)
if not args then return redis.error_reply(err) end
local now = now_us()
local state, load_err = leaky_bucket.load(KEYS[1], args, now)
if state == nil then return load_err end
local reply, write = decide_call(leaky_bucket, args, state, now)
if write then leaky_bucket.store(KEYS[1], write) end
return reply
