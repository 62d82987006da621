-- CL.THROTTLE (redis-cell's GCRA), the Lua twin of the module's CL.THROTTLE.
--
--   EVALSHA <sha> 1 <key> <max_burst> <count_per_period> <period> [quantity]
--
-- Reply: {limited, limit, remaining, retry_after_s, reset_after_s} with redis-cell's rounding,
-- errors word for word as the module's. State: a string key holding the theoretical arrival time
-- in unix nanoseconds (redis-cell's format), absolute expiry at the first millisecond from which
-- the key is equivalent to a new one.
--
-- Nanosecond times (~1.8e18) do not fit a double exactly, so every time and duration here is a
-- pair {seconds, nanoseconds} of integers below 2^53, and the arithmetic on pairs is exact: the
-- same integers as the module's (src/core/gcra.rs, src/command/throttle.rs), the same stored
-- digits and the same expiry. Only the emission interval, period * 1e9 / count, is a double, as
-- in redis-cell, and it is a whole number (truncated) before it is split into a pair.
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

-- @limiter throttle
local throttle = {
  ARITY = "ERR wrong number of arguments for 'cl.throttle' command",
}

local NS = 1000000000

-- {s, n} with 0 <= n < 1e9, from parts whose n is at most one second out of that range.
local function ns_pair(s, n)
  if n >= NS then return {s + 1, n - NS} end
  if n < 0 then return {s - 1, n + NS} end
  return {s, n}
end

local function ns_add(a, b) return ns_pair(a[1] + b[1], a[2] + b[2]) end
local function ns_sub(a, b) return ns_pair(a[1] - b[1], a[2] - b[2]) end
local function ns_less(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end
local function ns_positive(a) return a[1] > 0 or (a[1] == 0 and a[2] > 0) end

local function ns_from_us(us)
  local s = math.floor(us / 1000000)
  return ns_pair(s, (us - s * 1000000) * 1000)
end

-- A whole number of nanoseconds held in a double (at most ~1e18; above 2^53 every double is
-- whole). fmod is exact; x - n may round, by far less than half a second.
local function ns_split(x)
  local n = math.fmod(x, NS)
  return {math.floor((x - n) / NS + 0.5), n}
end

-- t * q for a product of at most ~1e18 ns: t[2] * q may pass 2^53, so q is split at 1e6
-- (t[2] * qh counts milliseconds and is at most the product / 1e6; t[2] * ql < 1e15).
local function ns_times(t, q)
  local qh = math.floor(q / 1000000)
  local ql = q - qh * 1000000
  local ms = t[2] * qh
  local ms_s = math.floor(ms / 1000)
  local low = t[2] * ql
  local low_s = math.floor(low / NS)
  return ns_add({t[1] * q + ms_s, (ms - ms_s * 1000) * 1000000}, {low_s, low - low_s * NS})
end

-- Seconds and nanoseconds both truncated toward zero, as a signed duration splits.
local function ns_trunc_parts(d)
  if d[1] < 0 and d[2] > 0 then return d[1] + 1, d[2] - NS end
  return d[1], d[2]
end

local function trunc(x)
  if x >= 0 then return math.floor(x) end
  return math.ceil(x)
end

-- redis-cell's seconds: secs + nanos / 1e9 as a double, truncated, plus one if at least a
-- millisecond is left over.
local function cell_seconds(d)
  local s, n = ns_trunc_parts(d)
  local whole = trunc(s + n / NS)
  if n >= 1000000 then whole = whole + 1 end
  return whole
end

-- A duration in whole microseconds (truncated toward zero), as a double.
local function ns_whole_us(d)
  local s, n = ns_trunc_parts(d)
  return s * 1000000 + trunc(n / 1000)
end

function throttle.parse(argv)
  if #argv < 3 or #argv > 4 then return nil, throttle.ARITY end
  local max_burst, count, period, quantity, err
  max_burst, err = integer_arg(argv[1], 0, MAX_INTEGER_ARG,
    'ERR max_burst must be an integer', 'ERR max_burst must be between 0 and 1000000000000000')
  if not max_burst then return nil, err end
  count, err = integer_arg(argv[2], 1, MAX_INTEGER_ARG, 'ERR count_per_period must be an integer',
    'ERR count_per_period must be between 1 and 1000000000000000')
  if not count then return nil, err end
  period, err = integer_arg(argv[3], 1, MAX_INTEGER_ARG,
    'ERR period must be an integer', 'ERR period must be between 1 and 1000000000000000')
  if not period then return nil, err end
  quantity = 1
  if argv[4] then
    quantity, err = integer_arg(argv[4], 0, MAX_INTEGER_ARG,
      'ERR quantity must be an integer', 'ERR quantity must be between 0 and 1000000000000000')
    if not quantity then return nil, err end
  end
  local interval = math.floor(period * 1000000000 / count)
  local limit = max_burst + 1
  if interval < 1000 then
    return nil, 'ERR count_per_period / period must be at most 1000000 per second'
  end
  if interval * limit > 1e18 then
    return nil, 'ERR (max_burst + 1) * period / count_per_period must be at most 1000000000 seconds'
  end
  local t = ns_split(interval)
  return {interval = t, limit = limit, tolerance = ns_times(t, limit), quantity = quantity}
end

-- false for a new key, the stored time as a call with these parameters at `now_us` reads it, or
-- nil and an error reply: another limiter's state is an error (a tagged value, or RL.GCRA's
-- microseconds from before values had tags, which as nanoseconds lie within weeks of 1970); a
-- time further ahead than a full burst past a full one and the clock skew is read as that much
-- ahead (parameters lowered since).
function throttle.load(key, a, now_us)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' and v.err then return nil, v end
  if not v then return false end
  local word = string.match(v, '^(%l+) ') or string.match(v, '^(%l+)$')
  if word and KINDS[word] then return nil, foreign(KINDS[word], 'CL.THROTTLE') end
  if string.match(v, '^%d+$') then
    local s, n = 0, tonumber(v)
    if #v > 9 then s, n = tonumber(string.sub(v, 1, -10)), tonumber(string.sub(v, -9)) end
    if s < 9.2e9 then
      local tat = {s, n}
      if now_us > 0 then
        -- Microseconds of about now (from half to twice it). 2 * now_us is exact (even, below
        -- 2^54), and so are the split parts of both bounds.
        local twice = 2 * now_us
        local ts = math.floor(twice / NS)
        local ns = math.floor(now_us / NS)
        if ns_less(tat, {ts, twice - ts * NS})
            and not ns_less(ns_add(tat, tat), {ns, now_us - ns * NS}) then
          return nil, foreign('RL.GCRA', 'CL.THROTTLE')
        end
      end
      -- As it is, however far ahead (parameters lowered since): the wait a denial replies
      -- counts from it.
      return tat
    end
  end
  return nil, redis.error_reply('ERR corrupt rate limiter state: the value is not a timestamp in nanoseconds')
end

-- The reply, and what to store (nil when nothing is written).
function throttle.decide(a, state, now_us)
  local now = ns_from_us(now_us)
  local tat = state or now
  local limited, ttl, retry_after, write = true, ns_sub(tat, now), -1, nil
  if a.quantity <= a.limit then
    local base = tat
    if ns_less(tat, now) then base = now end
    local new_tat = ns_add(base, ns_times(a.interval, a.quantity))
    local wait = ns_sub(ns_sub(new_tat, a.tolerance), now)
    if ns_positive(wait) then
      retry_after = cell_seconds(wait)
    else
      limited, ttl = false, ns_sub(new_tat, now)
      if a.quantity > 0 then
        write = {tat = new_tat, expire_at = new_tat[1] * 1000 + math.ceil(new_tat[2] / 1000000)}
      end
    end
  end
  local next = ns_sub(a.tolerance, ttl)
  local remaining = 0
  if ns_positive(ns_add(next, a.interval)) then
    remaining = trunc(ns_whole_us(next) / ns_whole_us(a.interval))
  end
  return {limited and 1 or 0, a.limit, remaining, retry_after, cell_seconds(ttl)}, write
end

function throttle.store(key, w)
  local text = string.format('%.0f', w.tat[2])
  if w.tat[1] > 0 then text = string.format('%.0f%09.0f', w.tat[1], w.tat[2]) end
  redis.call('SET', key, text, 'PXAT', w.expire_at)
end
-- @end

-- @main
if #KEYS ~= 1 then return redis.error_reply(throttle.ARITY) end
local args, err = throttle.parse(ARGV)
if not args then return redis.error_reply(err) end
local now = now_us()
local state, load_err = throttle.load(KEYS[1], args, now)
if state == nil then return load_err end
local reply, write = throttle.decide(args, state, now)
if write then throttle.store(KEYS[1], write) end
return reply
