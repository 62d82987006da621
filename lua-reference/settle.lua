-- Settling reserved costs, the Lua twin of RL.SETTLE.
--
--   EVALSHA <sha> <numkeys> <key> [key ...] <ALGORITHM> <params...> [...] DELTA <n>
--
-- The limits are written as for all.lua. A negative n refunds |n| units to every limit, a
-- positive n charges n units without any admission check (a limit may go into debt), DELTA 0
-- reports and writes nothing. Reply: {{reply of limit 1}, {reply of limit 2}, ...}, each the
-- limit's state after settlement (allowed 1, retry_after_ms 0).
--
-- The @common and @limiter blocks below are copies of the per-algorithm scripts' blocks;
-- tests/lua_blocks.rs checks that they are identical.

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

-- @limiter token_bucket
local token_bucket = {
  ARITY = "ERR wrong number of arguments for 'rl.tokenbucket' command",
  -- The parameters between the key and the cost.
  PARAMS = 2,
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

-- false for a new bucket, the state as a call at `now` reads it, or nil and an error reply.
function token_bucket.load(key, _, now)
  local fields, err = load_fields(key, 'tb', 'tokens', 'ts')
  if not fields then return fields, err end
  local tokens = stored_balance(fields[1])
  if not tokens then
    return nil, redis.error_reply("ERR corrupt rate limiter state: field 'tokens' is not a valid number")
  end
  local ts = stored_timestamp(fields[2])
  if not ts then
    return nil, redis.error_reply("ERR corrupt rate limiter state: field 'ts' is not a valid timestamp")
  end
  ts = within_skew(ts, now)
  if not ts then
    return nil, redis.error_reply("ERR corrupt rate limiter state: field 'ts' is ahead of the server's clock by more than 60 seconds")
  end
  return {tokens = tokens, ts = ts}
end

-- The tokens as of now (a debt down to -capacity), and the time to store with them.
function token_bucket.current(a, state, now)
  local capacity = a.capacity
  local tokens, ts = capacity, now
  if state then tokens, ts = state.tokens, state.ts end
  -- A debt is at most one capacity, cut to it as of the stored time, before the refill.
  if tokens < -capacity then tokens = -capacity end
  -- A clock that went backwards refills nothing and never moves the stored time back.
  local elapsed = now - ts
  if elapsed < 0 then elapsed = 0 end
  local t = now
  if ts > now then t = ts end
  tokens = tokens + elapsed * a.rate / 1000000
  if tokens > capacity then tokens = capacity end
  return tokens, t
end

function token_bucket.write(a, tokens, t)
  local reset_after = math.ceil((a.capacity - tokens) * 1000 / a.rate)
  return {tokens = tokens, ts = t, expire_at = math.ceil(t / 1000) + reset_after}
end

-- RL.SETTLE: delta units refunded (negative, never above capacity) or charged (positive, down
-- to a debt of -capacity) without an admission check. The reply, and what to store (nil when nothing changes).
function token_bucket.settle(a, state, now, delta)
  if delta == 0 or (delta < 0 and not state) then return settled(token_bucket.decide(a, state, now)) end
  local tokens, t = token_bucket.current(a, state, now)
  tokens = tokens - delta
  if tokens > a.capacity then tokens = a.capacity end
  if tokens < -a.capacity then tokens = -a.capacity end
  local w = token_bucket.write(a, tokens, t)
  return settled(token_bucket.decide(a, w, now)), w
end

-- The reply, and what to store (nil when nothing is written).
function token_bucket.decide(a, state, now)
  local capacity, rate, cost = a.capacity, a.rate, a.cost
  local tokens, t = token_bucket.current(a, state, now)

  local allowed = cost <= tokens
  local consumes = allowed and cost > 0
  if consumes then tokens = tokens - cost end

  -- Milliseconds until refilling starts: 0, or as long as a stored time lies ahead of now.
  local ahead = (t - now) / 1000
  local retry_after
  if allowed then
    retry_after = 0
  elseif cost > capacity then
    retry_after = -1
  else
    retry_after = math.ceil(ahead + (cost - tokens) * 1000 / rate)
  end
  local reset_after = math.ceil(ahead + (capacity - tokens) * 1000 / rate)
  -- A debt leaves nothing, not less.
  local remaining = math.floor(tokens)
  if remaining < 0 then remaining = 0 end

  local write
  if consumes then write = token_bucket.write(a, tokens, t) end
  return {allowed and 1 or 0, remaining, retry_after, reset_after, capacity}, write
end

function token_bucket.store(key, w)
  store_fields(key, w.expire_at, 'tb', w.tokens, w.ts)
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

-- @limiter fixed_window
local fixed_window = {
  ARITY = "ERR wrong number of arguments for 'rl.fixedwindow' command",
  -- The parameters between the key and the cost.
  PARAMS = 2,
  MAX_WINDOW_SECONDS = 1e10,
}

-- The window in whole milliseconds (rounded to nearest), or nil and the error message.
function fixed_window.window_arg(s)
  if not is_decimal(s) then return nil, 'ERR window_sec must be a number' end
  local v = tonumber(s)
  local out_of_range =
    'ERR window_sec must be between 0.001 and 10000000000 (it is rounded to whole milliseconds)'
  if v > fixed_window.MAX_WINDOW_SECONDS then return nil, out_of_range end
  local window_ms = math.floor(v * 1000 + 0.5)
  if window_ms >= 1 then return window_ms end
  return nil, out_of_range
end

function fixed_window.parse(argv)
  if #argv < 2 or #argv > 3 then return nil, fixed_window.ARITY end
  local limit, window_ms, cost, err
  limit, err = integer_arg(argv[1], 1, MAX_INTEGER_ARG,
    'ERR limit must be an integer', 'ERR limit must be between 1 and 1000000000000000')
  if not limit then return nil, err end
  window_ms, err = fixed_window.window_arg(argv[2])
  if not window_ms then return nil, err end
  cost, err = cost_arg(argv[3])
  if not cost then return nil, err end
  return {limit = limit, window_ms = window_ms, cost = cost}
end

-- false for a new key, the state, or nil and an error reply.
function fixed_window.load(key, _, now)
  local fields, err = load_fields(key, 'fw', 'count', 'start')
  if not fields then return fields, err end
  local count = stored_amount(fields[1])
  if not count then
    return nil, redis.error_reply("ERR corrupt rate limiter state: field 'count' is not a valid number")
  end
  local start = stored_timestamp(fields[2])
  if not start then
    return nil, redis.error_reply("ERR corrupt rate limiter state: field 'start' is not a valid timestamp")
  end
  start = within_skew(start, now)
  if not start then
    return nil, redis.error_reply("ERR corrupt rate limiter state: field 'start' is ahead of the server's clock by more than 60 seconds")
  end
  return {count = count, start = start}
end

-- RL.SETTLE: delta units refunded (negative, never below 0, nothing once the window ended) or
-- charged (positive; with no window open, one opens now) without an admission check. The reply,
-- and what to store (nil when nothing changes).
function fixed_window.settle(a, state, now, delta)
  local window_ms = a.window_ms
  -- A charge fills a window up to twice its limit, as the leaky bucket's level.
  local most = 2 * a.limit
  local w
  if delta == 0 then
    w = nil
  elseif not (state and now - state.start < window_ms * 1000) then
    if delta > 0 then
      local count = delta
      if count > most then count = most end
      w = {count = count, start = now, expire_at = math.ceil(now / 1000) + window_ms}
    end
  else
    local count = state.count + delta
    if count < 0 then count = 0 end
    if count > most then count = most end
    w = {count = count, start = state.start, expire_at = math.ceil(state.start / 1000) + window_ms}
  end
  return settled(fixed_window.decide(a, w or state, now)), w
end

-- The reply, and what to store (nil when nothing is written).
function fixed_window.decide(a, state, now)
  local limit, window_ms, cost = a.limit, a.window_ms, a.cost
  local window_us = window_ms * 1000
  -- A stored window is current until its end; a clock that went backwards stays in it.
  local count, start, open = 0, now, false
  if state and now - state.start < window_us then
    count, start, open = state.count, state.start, true
  end

  local allowed = count + cost <= limit
  local consumes = allowed and cost > 0
  if consumes then count = count + cost end

  -- Milliseconds until start + window_us, rounded up, exact below 2^53.
  local until_end = window_ms + math.ceil((start - now) / 1000)
  local retry_after
  if allowed then
    retry_after = 0
  elseif cost > limit then
    retry_after = -1
  else
    retry_after = until_end
  end
  local reset_after = 0
  if open or consumes then reset_after = until_end end
  -- A count above the limit (the limit argument was lowered) leaves nothing, not less.
  local remaining = limit - count
  if remaining < 0 then remaining = 0 end

  local write
  if consumes then
    write = {count = count, start = start, expire_at = math.ceil(start / 1000) + window_ms}
  end
  return {allowed and 1 or 0, remaining, retry_after, reset_after, limit}, write
end

function fixed_window.store(key, w)
  store_fields(key, w.expire_at, 'fw', w.count, w.start)
end
-- @end

-- @limiter sliding_window
local sliding_window = {
  ARITY = "ERR wrong number of arguments for 'rl.slidingwindow' command",
  -- The parameters between the key and the cost.
  PARAMS = 2,
  MAX_WINDOW_SECONDS = 1e10,
}

-- The window in whole milliseconds (rounded to nearest), or nil and the error message.
function sliding_window.window_arg(s)
  if not is_decimal(s) then return nil, 'ERR window_sec must be a number' end
  local v = tonumber(s)
  local out_of_range =
    'ERR window_sec must be between 0.001 and 10000000000 (it is rounded to whole milliseconds)'
  if v > sliding_window.MAX_WINDOW_SECONDS then return nil, out_of_range end
  local window_ms = math.floor(v * 1000 + 0.5)
  if window_ms >= 1 then return window_ms end
  return nil, out_of_range
end

function sliding_window.parse(argv)
  if #argv < 2 or #argv > 3 then return nil, sliding_window.ARITY end
  local limit, window_ms, cost, err
  limit, err = integer_arg(argv[1], 1, MAX_INTEGER_ARG,
    'ERR limit must be an integer', 'ERR limit must be between 1 and 1000000000000000')
  if not limit then return nil, err end
  window_ms, err = sliding_window.window_arg(argv[2])
  if not window_ms then return nil, err end
  cost, err = cost_arg(argv[3])
  if not cost then return nil, err end
  return {limit = limit, window_ms = window_ms, cost = cost}
end

-- false for a new key, the state, or nil and an error reply.
function sliding_window.load(key, _, now)
  local fields, err = load_fields(key, 'sw', 'start', 'cur', 'prev')
  if not fields then return fields, err end
  local start = stored_timestamp(fields[1])
  if not start then
    return nil, redis.error_reply("ERR corrupt rate limiter state: field 'start' is not a valid timestamp")
  end
  start = within_skew(start, now)
  if not start then
    return nil, redis.error_reply("ERR corrupt rate limiter state: field 'start' is ahead of the server's clock by more than 60 seconds")
  end
  local cur = stored_amount(fields[2])
  if not cur then
    return nil, redis.error_reply("ERR corrupt rate limiter state: field 'cur' is not a valid number")
  end
  local prev = stored_amount(fields[3])
  if not prev then
    return nil, redis.error_reply("ERR corrupt rate limiter state: field 'prev' is not a valid number")
  end
  return {start = start, cur = cur, prev = prev}
end

-- The current window's start, the time into it, and the two counts as of now.
function sliding_window.current(a, state, now)
  local window = a.window_ms * 1000
  local w = math.floor(now / window) * window
  local start, elapsed, cur, prev = w, now - w, 0, 0
  if state then
    -- A window of another length (changed since) is read as the window of this length that
    -- holds its start.
    local stored = state.start
    if stored ~= w then stored = math.floor(stored / window) * window end
    if stored > w then
      -- The clock went backwards: stay in the stored window, at its beginning.
      start, elapsed, cur, prev = stored, 0, state.cur, state.prev
    elseif stored == w then
      cur, prev = state.cur, state.prev
    elseif stored == w - window then
      prev = state.cur
    end
  end
  return start, elapsed, cur, prev
end

function sliding_window.write(a, start, cur, prev)
  return {start = start, cur = cur, prev = prev,
    expire_at = math.ceil(start / 1000) + 2 * a.window_ms}
end

-- RL.SETTLE: delta units refunded (negative, never below 0) or charged (positive) on the current
-- window's counter without an admission check. The reply, and what to store (nil when nothing changes).
function sliding_window.settle(a, state, now, delta)
  if delta == 0 or (delta < 0 and not state) then return settled(sliding_window.decide(a, state, now)) end
  local start, _, cur, prev = sliding_window.current(a, state, now)
  cur = cur + delta
  if cur < 0 then cur = 0 end
  -- At most twice the limit in the current window, as the leaky bucket's level.
  if cur > 2 * a.limit then cur = 2 * a.limit end
  local w = sliding_window.write(a, start, cur, prev)
  return settled(sliding_window.decide(a, w, now)), w
end

-- The reply, and what to store (nil when nothing is written).
function sliding_window.decide(a, state, now)
  local limit, window_ms, cost = a.limit, a.window_ms, a.cost
  local window = window_ms * 1000
  local start, elapsed, cur, prev = sliding_window.current(a, state, now)
  local weighted = prev * (window - elapsed) / window
  local estimate = weighted + cur

  local allowed = estimate + cost <= limit
  local consumes = allowed and cost > 0
  if consumes then cur = cur + cost end

  -- Offset from start at which the same cost would be admitted if no other call came: within
  -- this window as the previous count's weight falls, or in the next one.
  local retry_after = 0
  if not allowed then
    if cost > limit then
      retry_after = -1
    else
      local room = limit - cost
      local offset = 0
      if cur > room then
        offset = window + window * (cur - room) / cur
      elseif prev > 0 then
        offset = window * (prev - (room - cur)) / prev
      end
      retry_after = math.ceil((start - now + offset) / 1000)
      if retry_after < 1 then retry_after = 1 end
    end
  end
  -- Milliseconds until the estimate is 0, exact below 2^53.
  local to_start = math.ceil((start - now) / 1000)
  local reset_after = 0
  if cur > 0 then
    reset_after = 2 * window_ms + to_start
  elseif prev > 0 then
    reset_after = window_ms + to_start
  end
  local remaining = math.floor(limit - (weighted + cur))
  if remaining < 0 then remaining = 0 end

  local write
  if consumes then write = sliding_window.write(a, start, cur, prev) end
  return {allowed and 1 or 0, remaining, retry_after, reset_after, limit}, write
end

function sliding_window.store(key, w)
  store_fields(key, w.expire_at, 'sw', w.start, w.cur, w.prev)
end
-- @end

-- @limiter gcra
local gcra = {
  ARITY = "ERR wrong number of arguments for 'rl.gcra' command",
  -- The parameters between the key and the cost.
  PARAMS = 3,
}

function gcra.parse(argv)
  if #argv < 3 or #argv > 4 then return nil, gcra.ARITY end
  local max_burst, count, period, cost, err
  max_burst, err = integer_arg(argv[1], 0, MAX_INTEGER_ARG,
    'ERR max_burst must be an integer', 'ERR max_burst must be between 0 and 1000000000000000')
  if not max_burst then return nil, err end
  count, err = integer_arg(argv[2], 1, MAX_INTEGER_ARG, 'ERR count_per_period must be an integer',
    'ERR count_per_period must be between 1 and 1000000000000000')
  if not count then return nil, err end
  period, err = rate_arg(argv[3], 'ERR period_sec must be a number',
    'ERR period_sec must be greater than 0 and at most 1000000000000000')
  if not period then return nil, err end
  cost, err = cost_arg(argv[4])
  if not cost then return nil, err end
  if period * 1000000 / count < 1 then
    return nil, 'ERR count_per_period / period_sec must be at most 1000000 per second'
  end
  local interval = math.ceil(period * 1000000 / count)
  local limit = max_burst + 1
  local tolerance = interval * limit
  if tolerance > 1e15 then
    return nil, 'ERR (max_burst + 1) * period_sec / count_per_period must be at most 1000000000 seconds'
  end
  return {interval = interval, limit = limit, tolerance = tolerance, cost = cost}
end

-- false for a new key, the state as a call with these parameters at `now` reads it, or nil and
-- an error reply. A time further ahead than a full burst past a full one (2 * tolerance, the most
-- a settlement charges) and the clock skew is read as that much ahead (parameters lowered since).
function gcra.load(key, a, now)
  local fields, err = load_fields(key, 'gcra', 'tat')
  if not fields then return fields, err end
  local s = fields[1]
  local tat = s and is_integer(s) and tonumber(s)
  if tat and tat > 8e15 and now > 0 and tat >= 500 * now then
    -- Nanoseconds of about now: CL.THROTTLE's (redis-cell's) value, which has no tag.
    return nil, foreign('CL.THROTTLE', 'RL.GCRA')
  end
  if not (tat and tat >= 0 and tat <= 8e15) then
    return nil, redis.error_reply("ERR corrupt rate limiter state: field 'tat' is not a valid timestamp")
  end
  -- As it is, however far ahead (parameters lowered since): the wait a denial replies counts
  -- from it.
  return {tat = tat}
end

-- RL.SETTLE: the theoretical arrival time moved by delta emission intervals without an
-- admission check (a charge from now at the earliest, to at most now + 2 * tolerance; a refund
-- never before now, and none while idle). The reply, and what to store (nil when nothing
-- changes).
function gcra.settle(a, state, now, delta)
  local tat = now
  if state then tat = state.tat end
  local moved = a.interval * delta
  local new_tat
  if delta > 0 then
    local base = tat
    if now > base then base = now end
    new_tat = base + moved
    if new_tat > now + 2 * a.tolerance then new_tat = now + 2 * a.tolerance end
  elseif delta < 0 and tat > now then
    new_tat = tat + moved
    if new_tat < now then new_tat = now end
  end
  local w
  if new_tat then w = {tat = new_tat, expire_at = math.ceil(new_tat / 1000)} end
  return settled(gcra.decide(a, w or state, now)), w
end

-- The reply, and what to store (nil when nothing is written).
function gcra.decide(a, state, now)
  local interval, limit, tolerance, cost = a.interval, a.limit, a.tolerance, a.cost
  local tat = now
  if state then tat = state.tat end
  local allowed, ttl, retry_after, write = false, tat - now, -1, nil
  if cost <= limit then
    local base = tat
    if now > base then base = now end
    local new_tat = base + interval * cost
    local allow_at = new_tat - tolerance
    if allow_at > now then
      retry_after = math.ceil((allow_at - now) / 1000)
    else
      allowed, ttl, retry_after = true, new_tat - now, 0
      if cost > 0 then write = {tat = new_tat, expire_at = math.ceil(new_tat / 1000)} end
    end
  end
  if ttl < 0 then ttl = 0 end
  local remaining = 0
  if tolerance - ttl > 0 then remaining = math.floor((tolerance - ttl) / interval) end
  return {allowed and 1 or 0, remaining, retry_after, math.ceil(ttl / 1000), limit}, write
end

function gcra.store(key, w)
  store_fields(key, w.expire_at, 'gcra', w.tat)
end
-- @end

-- @limiter sliding_log
local sliding_log = {
  ARITY = "ERR wrong number of arguments for 'rl.slidinglog' command",
  -- The parameters between the key and the cost.
  PARAMS = 2,
  -- Every admitted unit is one member of about 120 bytes: this bounds a key's memory (and the
  -- time a server takes to free it when it expires).
  MAX_LIMIT = 10000,
  MAX_WINDOW_SECONDS = 1e10,
  -- A partial grant takes at most as many entries as a cost.
  UPTO_MAX = 1000,
  UPTO_RANGE = 'ERR UPTO must be between 1 and 1000 for a sliding log (one entry per unit)',
  -- Members per ZADD call: unpack() returns fewer than 8000 results (Lua's C stack limit).
  ZADD_BATCH = 2000,
  -- The most entries one call adds or removes through its cost or settlement.
  MAX_ENTRIES_PER_CALL = 1000,
}

function sliding_log.parse(argv)
  if #argv < 2 or #argv > 3 then return nil, sliding_log.ARITY end
  local limit, cost, err
  limit, err = integer_arg(argv[1], 1, sliding_log.MAX_LIMIT,
    'ERR limit must be an integer', 'ERR limit must be between 1 and 10000')
  if not limit then return nil, err end
  if not is_decimal(argv[2]) then return nil, 'ERR window_sec must be a number' end
  local window_sec = tonumber(argv[2])
  if not (window_sec > 0 and window_sec <= sliding_log.MAX_WINDOW_SECONDS) then
    return nil, 'ERR window_sec must be greater than 0 and at most 10000000000'
  end
  -- Millisecond resolution, rounded half up.
  local window_ms = math.floor(window_sec * 1000 + 0.5)
  if window_ms < 1 then return nil, 'ERR window_sec must be at least 1 millisecond' end
  cost = 1
  if argv[3] then
    cost, err = integer_arg(argv[3], 0, sliding_log.MAX_ENTRIES_PER_CALL, 'ERR cost must be an integer',
      'ERR cost must be between 0 and 1000 for a sliding log (one entry per unit)')
    if not cost then return nil, err end
  end
  return {limit = limit, window_ms = window_ms, window_us = window_ms * 1000, cost = cost}
end

-- An entry as a call at `now` reads it: its score, or nil and an error reply. An integer score in
-- [0, 2^53], the member "<score>:<n>" (a member without ':' that a lease set could hold is a
-- lease set's), and a score no further ahead of now than the clock skew.
local function sliding_log_check(member, score, now)
  score = stored_timestamp(score)
  if not score then
    return nil, redis.error_reply('ERR corrupt rate limiter state: sorted set score is not a valid timestamp')
  end
  local t = string.match(member, '^(%d+):%d+$')
  if not t or tonumber(t) ~= score then
    if #member >= 1 and #member <= 128 and not string.find(member, ':', 1, true) then
      return nil, foreign('RL.ACQUIRE', 'RL.SLIDINGLOG')
    end
    return nil, redis.error_reply("ERR corrupt rate limiter state: sorted set member is not '<score>:<n>'")
  end
  if score > now + SKEW_US then
    return nil, redis.error_reply("ERR corrupt rate limiter state: sorted set score is further ahead of the server's clock than any call writes")
  end
  return score
end

-- The score of the entry `rank` places before the newest (0 is the newest), checked. False past
-- the oldest, or nil and an error.
local function sliding_log_entry(key, rank, now)
  local entry = redis.call('ZRANGE', key, rank, rank, 'REV', 'WITHSCORES')
  if #entry == 0 then return false end
  return sliding_log_check(entry[1], entry[2], now)
end

-- The oldest `n` entries, which a write is about to remove, checked: nil, or an error reply.
local function sliding_log_check_oldest(key, n, now)
  if n <= 0 then return nil end
  local entries = redis.call('ZRANGE', key, '0', string.format('%.0f', n - 1), 'WITHSCORES')
  for i = 1, #entries, 2 do
    local score, err = sliding_log_check(entries[i], entries[i + 1], now)
    if not score then return err end
  end
  return nil
end

-- What a call needs to know of the log, each in O(log n): its length, the newest entry (the one
-- entry every call checks), how many entries are still in the window, and how many share the
-- newest score when new entries would join them. False for a new key, or nil and an error reply.
function sliding_log.load(key, a, now)
  local len = redis.pcall('ZCARD', key)
  if type(len) == 'table' then return nil, len end
  if len == 0 then return false end
  -- Every set the module writes has an expiry.
  if redis.call('PTTL', key) == -1 then
    return nil, redis.error_reply('WRONGTYPE the key holds a sorted set without an expiry, which no rate limiter writes')
  end
  local newest, err = sliding_log_entry(key, 0, now)
  if newest == nil then return nil, err end
  local count = redis.call('ZCOUNT', key, string.format('(%.17g', now - a.window_us), '+inf')
  local tied = 0
  if newest and newest >= now then
    local at = string.format('%.17g', newest)
    tied = redis.call('ZCOUNT', key, at, at)
  end
  return {len = len, count = count, newest = newest, tied = tied}
end

-- Milliseconds from now until an entry at `score` leaves the window, rounded up.
local function sliding_log_leaves_after(a, score, now)
  return math.ceil((score - now) / 1000) + a.window_ms
end

-- The reply, and what to store (nil when nothing is written); or nil and an error reply when
-- the entry a denial reads is corrupt.
function sliding_log.decide(a, view, now, key)
  local limit, cost = a.limit, a.cost
  view = view or {len = 0, count = 0, tied = 0}
  local count = view.count

  -- A clock that went backwards never places new entries before stored ones.
  local t = now
  if view.newest and view.newest > now then t = view.newest end

  local allowed = count + cost <= limit
  local admits = allowed and cost > 0
  local count_after = count
  if admits then count_after = count + cost end
  local remaining = limit - count_after
  if remaining < 0 then remaining = 0 end
  local retry_after
  if allowed then
    retry_after = 0
  elseif cost > limit then
    retry_after = -1
  else
    -- Enough room once the k-th oldest entry in the window has left it, k = count + cost -
    -- limit: that one is `limit - cost` places before the newest.
    local score, err = sliding_log_entry(key, limit - cost, now)
    if score == nil then return nil, err end
    if score then retry_after = sliding_log_leaves_after(a, score, now) else retry_after = -1 end
  end
  local reset_after = 0
  if admits then
    reset_after = sliding_log_leaves_after(a, t, now)
  elseif count > 0 then
    reset_after = sliding_log_leaves_after(a, view.newest, now)
  end

  local write
  if admits then
    local trim = trim_count(view.len - count, cost)
    local err = sliding_log_check_oldest(key, trim, now)
    if err then return nil, err end
    write = {trim = trim, t = t, first = view.tied, count = cost,
             expire_at = math.ceil(t / 1000) + a.window_ms}
  end
  return {allowed and 1 or 0, remaining, retry_after, reset_after, limit}, write
end

-- RL.SETTLE: delta units refunded (negative: the newest entries still in the window leave, at
-- most as many as there are) or charged (positive: entries join at the call time until the window
-- holds limit of them; a log has no debt) without an admission check. The reply, and what to
-- store (nil when nothing changes); or nil and an error reply when an entry it reads is corrupt.
function sliding_log.settle(a, view, now, delta, key)
  local limit = a.limit
  view = view or {len = 0, count = 0, tied = 0}
  local count = view.count
  local old = view.len - count
  local count_after, newest, write = count, nil, nil
  if count > 0 then newest = view.newest end
  if delta > 0 and count < limit then
    local t = now
    if view.newest and view.newest > now then t = view.newest end
    local added = delta
    if added > limit - count then added = limit - count end
    write = {trim = trim_count(old, added), t = t, first = view.tied, count = added,
             expire_at = math.ceil(t / 1000) + a.window_ms}
    count_after, newest = count + added, t
  elseif delta < 0 and count > 0 then
    local dropped = -delta
    if dropped > count then dropped = count end
    local next = false
    if dropped < count then
      local err
      next, err = sliding_log_entry(key, dropped, now)
      if next == nil then return nil, err end
    end
    local expire_at
    if next then expire_at = math.ceil(next / 1000) + a.window_ms end
    write = {trim = trim_count(old, 0), drop = dropped, expire_at = expire_at}
    count_after, newest = count - dropped, next or nil
  end
  if write then
    local err = sliding_log_check_oldest(key, write.trim, now)
    if err then return nil, err end
  end
  local reset_after = 0
  if newest and count_after > 0 then reset_after = sliding_log_leaves_after(a, newest, now) end
  local remaining = limit - count_after
  if remaining < 0 then remaining = 0 end
  return {1, remaining, 0, reset_after, limit}, write
end

function sliding_log.store(key, w)
  if w.trim > 0 then redis.call('ZREMRANGEBYRANK', key, '0', string.format('%.0f', w.trim - 1)) end
  if w.drop then
    -- A refund: the newest entries leave.
    redis.call('ZREMRANGEBYRANK', key, string.format('%.0f', -w.drop), '-1')
    if w.expire_at then redis.call('PEXPIREAT', key, string.format('%.0f', w.expire_at)) end
    return
  end
  local t = string.format('%.0f', w.t)
  local batch = {}
  for i = w.first, w.first + w.count - 1 do
    batch[#batch + 1] = t
    batch[#batch + 1] = t .. ':' .. string.format('%.0f', i)
    if #batch == 2 * sliding_log.ZADD_BATCH then
      redis.call('ZADD', key, unpack(batch))
      batch = {}
    end
  end
  if #batch > 0 then redis.call('ZADD', key, unpack(batch)) end
  redis.call('PEXPIREAT', key, string.format('%.0f', w.expire_at))
end
-- @end

-- @main
local ALGORITHMS = {
  {keyword = 'TOKENBUCKET', params = 2, limiter = token_bucket},
  {keyword = 'LEAKYBUCKET', params = 2, limiter = leaky_bucket},
  {keyword = 'FIXEDWINDOW', params = 2, limiter = fixed_window},
  {keyword = 'SLIDINGWINDOW', params = 2, limiter = sliding_window},
  {keyword = 'GCRA', params = 3, limiter = gcra},
  {keyword = 'SLIDINGLOG', params = 2, limiter = sliding_log},
}
local ARITY = "ERR wrong number of arguments for 'rl.settle' command"
local n = #KEYS
-- The shortest call is `numkeys key ALGORITHM p1 p2 DELTA n`.
if n + #ARGV < 6 then return redis.error_reply(ARITY) end
if n < 1 or n > 16 then
  return redis.error_reply('ERR numkeys must be an integer between 1 and 16')
end

-- One limit per key (a keyword and its parameters) and DELTA n must follow the keys.
local shortest
for _, a in ipairs(ALGORITHMS) do
  if not shortest or a.params + 1 < shortest then shortest = a.params + 1 end
end
if #ARGV < n * shortest + 2 then
  return redis.error_reply(ARITY .. ': numkeys limits and DELTA n must follow the keys')
end
-- The words a parse reads (src/command/all.rs, read_part): all of them, or for a call longer than
-- any valid one (numkeys, 16 keys and 16 limits of at most 4 words, then DELTA n) the first word
-- past the longest head and the last 2, so its cost is the same however long it is.
local MAX_HEAD, LAST_WORDS = 81, 2
local words = {}
if 1 + n + #ARGV <= MAX_HEAD + LAST_WORDS then
  for i = 1, #ARGV do words[i] = ARGV[i] end
else
  for i = 1, MAX_HEAD - n do words[i] = ARGV[i] end
  for i = #ARGV - LAST_WORDS + 1, #ARGV do words[#words + 1] = ARGV[i] end
end
-- A keyword in upper case; a word longer than every keyword is none of them.
local function keyword_of(word)
  if #word > 16 then return '' end
  return string.upper(word)
end
if keyword_of(words[#words - 1]) ~= 'DELTA' then
  return redis.error_reply('ERR the call must end with DELTA n')
end
local delta, err = integer_arg(words[#words], -MAX_INTEGER_ARG, MAX_INTEGER_ARG,
  'ERR DELTA must be an integer', 'ERR DELTA must be between -1000000000000000 and 1000000000000000')
if not delta then return redis.error_reply(err) end
words[#words] = nil
words[#words] = nil

local limits = {}
local i = 1
while i <= #words do
  -- A limit more than keys fails before it is read.
  if #limits == n then
    return redis.error_reply('ERR the number of limits must equal numkeys')
  end
  local algorithm
  local keyword = keyword_of(words[i])
  for _, a in ipairs(ALGORITHMS) do
    if a.keyword == keyword then algorithm = a end
  end
  if not algorithm then
    return redis.error_reply('ERR unknown algorithm, expected one of: TOKENBUCKET LEAKYBUCKET FIXEDWINDOW SLIDINGWINDOW GCRA SLIDINGLOG')
  end
  if #words - i < algorithm.params then return redis.error_reply(ARITY) end
  local params = {}
  for j = 1, algorithm.params do params[j] = words[i + j] end
  params[algorithm.params + 1] = '0'
  local args
  args, err = algorithm.limiter.parse(params)
  if not args then return redis.error_reply(err) end
  if algorithm.limiter == sliding_log and math.abs(delta) > sliding_log.MAX_ENTRIES_PER_CALL then
    return redis.error_reply('ERR DELTA must be between -1000 and 1000 for a sliding log (one entry per unit)')
  end
  limits[#limits + 1] = {limiter = algorithm.limiter, args = args}
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
local sets, entries = 0, 0
for _, limit in ipairs(limits) do
  if limit.limiter == sliding_log then sets = sets + 1 end
end
if sets > 4 then
  return redis.error_reply('ERR a call combines at most 4 SLIDINGLOG and CONCURRENCY limits')
end
for _, limit in ipairs(limits) do
  if limit.limiter == sliding_log then entries = entries + math.abs(delta) end
end
if entries > sliding_log.MAX_ENTRIES_PER_CALL then
  return redis.error_reply('ERR one call adds or removes at most 1000 sliding-log entries: |DELTA| times the SLIDINGLOG limits is above it')
end

-- Limits are read and settled in order, at one instant: the first bad key's error is the reply.
-- Each reply is the state after settlement as a peek reports it, admitted and with no wait.
local now = now_us()
local replies = {}
for k, limit in ipairs(limits) do
  local state, load_err = limit.limiter.load(KEYS[k], limit.args, now)
  if state == nil then return load_err end
  local reply, write = limit.limiter.settle(limit.args, state, now, delta, KEYS[k])
  if not reply then return write end
  replies[k], limit.write = reply, write
end
for k, limit in ipairs(limits) do
  if limit.write then limit.limiter.store(KEYS[k], limit.write) end
end
return replies
