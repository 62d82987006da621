-- GCRA, the Lua twin of RL.GCRA.
--
--   EVALSHA <sha> 1 <key> <max_burst> <count_per_period> <period_sec> [cost]
--
-- Reply: {allowed, remaining, retry_after_ms, reset_after_ms, limit}, errors word for word as
-- the module's. State: one string "<tat>" (theoretical arrival time, unix microseconds), expiry
-- at the first millisecond from which the key is equivalent to a new one (absolute). The emission interval
-- is rounded up to a whole microsecond, so every time here is an integer below 2^53 and exact in
-- a double: the same numbers as the module's integer arithmetic (src/core/gcra.rs), stored with
-- the same bytes ("%.17g" of an integer below 1e17 is its digits).
--
-- Layout shared by every script here: a "common" block (identical in all of them), one "limiter"
-- block with parse / load / decide / store, and a short "main". lua-reference/all.lua is
-- assembled from these blocks.

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

-- @main
if #KEYS ~= 1 then return redis.error_reply(gcra.ARITY) end
local args, err = parse_call(gcra, ARGV)
if not args then return redis.error_reply(err) end
local now = now_us()
local state, load_err = gcra.load(KEYS[1], args, now)
if state == nil then return load_err end
local reply, write = decide_call(gcra, args, state, now)
if write then gcra.store(KEYS[1], write) end
return reply
