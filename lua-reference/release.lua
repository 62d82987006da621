-- Releasing a lease, the Lua twin of RL.RELEASE.
--
--   EVALSHA <sha> 1 <key> <lease_id>
--
-- Frees the lease lua-reference/acquire.lua (or RL.ACQUIRE) took for lease_id. Reply: 1 when a
-- live lease was released, 0 when there was none; errors word for word as the module's. Its
-- limiter block is a copy of acquire.lua's.

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

-- @limiter concurrency
local concurrency = {
  ARITY = "ERR wrong number of arguments for 'rl.acquire' command",
  -- Every lease is one sorted-set member: this bounds a key's memory.
  MAX_LIMIT = 10000,
  MAX_LEASE_SECONDS = 1e7,
  MAX_ID_LEN = 128,
  -- The earliest expiry a lease has: 2020-09-13 12:26:40 UTC in Unix microseconds.
  EARLIEST_US = 1.6e15,
}

-- A lease id: 1 to 128 bytes, any bytes; nil and the error otherwise.
function concurrency.id_arg(id)
  if not id then return nil, 'ERR a CONCURRENCY limit needs LEASE lease_id' end
  if #id < 1 or #id > concurrency.MAX_ID_LEN then
    return nil, 'ERR lease_id must be 1 to 128 bytes'
  end
  return id
end

-- {limit, lease_sec, lease_id, cost}: RL.ACQUIRE gives the first three, RL.ALL all four (its
-- LEASE id, or nil, and its COST). A lease is one slot whatever the cost; a cost of 0 is a peek.
function concurrency.parse(argv)
  local limit, cost, id, err
  limit, err = integer_arg(argv[1], 1, concurrency.MAX_LIMIT,
    'ERR limit must be an integer', 'ERR limit must be between 1 and 10000')
  if not limit then return nil, err end
  if not is_decimal(argv[2]) then return nil, 'ERR lease_sec must be a number' end
  local lease_sec = tonumber(argv[2])
  if not (lease_sec > 0 and lease_sec <= concurrency.MAX_LEASE_SECONDS) then
    return nil, 'ERR lease_sec must be greater than 0 and at most 10000000'
  end
  -- Millisecond resolution, rounded half up.
  local lease_ms = math.floor(lease_sec * 1000 + 0.5)
  if lease_ms < 1 then return nil, 'ERR lease_sec must be at least 1 millisecond' end
  cost = 1
  if argv[4] then
    cost, err = cost_arg(argv[4])
    if not cost then return nil, err end
  end
  id, err = concurrency.id_arg(argv[3])
  if not id then return nil, err end
  return {limit = limit, lease_ms = lease_ms, lease_us = lease_ms * 1000, id = id, cost = cost}
end

-- A lease as a call at `now` reads it: its expiry, or nil and an error reply. An integer expiry
-- in [0, 2^53], an id of 1 to 128 bytes that is not a sliding log's member ("<score>:<n>" at its
-- own score), and an expiry from 2020 on and no further ahead of now than the longest lease and
-- the clock skew.
local function concurrency_check(member, score, now)
  local expiry = stored_timestamp(score)
  if not expiry then
    return nil, redis.error_reply('ERR corrupt rate limiter state: sorted set score is not a valid timestamp')
  end
  if #member < 1 or #member > concurrency.MAX_ID_LEN then
    return nil, redis.error_reply('ERR corrupt rate limiter state: sorted set member is not a lease id of 1 to 128 bytes')
  end
  local t = string.match(member, '^(%d+):%d+$')
  if t and tonumber(t) == expiry then return nil, foreign('RL.SLIDINGLOG', 'RL.ACQUIRE') end
  -- A lease's score is its expiry, never before 2020 (src/store/kind.rs, EARLIEST_LEASE_US): an
  -- earlier one is a leaderboard's points or a queue's times in seconds, not a lease.
  if expiry < concurrency.EARLIEST_US then
    return nil, redis.error_reply('WRONGTYPE the key holds a sorted set whose scores are not lease expiries (Unix microseconds from 2020 on), which no rate limiter writes')
  end
  if expiry > now + concurrency.MAX_LEASE_SECONDS * 1000000 + SKEW_US then
    return nil, redis.error_reply("ERR corrupt rate limiter state: sorted set score is further ahead of the server's clock than any call writes")
  end
  return expiry
end

-- The entry `rank` places before the newest (0 is the newest), checked. False past the oldest,
-- or nil and an error.
local function concurrency_entry(key, rank, id, now)
  local entry = redis.call('ZRANGE', key, rank, rank, 'REV', 'WITHSCORES')
  if #entry == 0 then return false end
  local expiry, err = concurrency_check(entry[1], entry[2], now)
  if not expiry then return nil, err end
  return {expiry = expiry, own = entry[1] == id}
end

-- The oldest `n` leases, which a write is about to remove, checked: nil, or an error reply.
local function concurrency_check_oldest(key, n, now)
  if n <= 0 then return nil end
  local entries = redis.call('ZRANGE', key, '0', string.format('%.0f', n - 1), 'WITHSCORES')
  for i = 1, #entries, 2 do
    local expiry, err = concurrency_check(entries[i], entries[i + 1], now)
    if not expiry then return err end
  end
  return nil
end

-- What a call needs to know of the leases, each in O(log n), in the order of
-- src/core/concurrency.rs: the size, the newest entry (and the one before it when the newest is
-- the call's own), the live count and the call's own lease. False for a new key, or nil and an
-- error reply.
function concurrency.load(key, a, now)
  local len = redis.pcall('ZCARD', key)
  if type(len) == 'table' then return nil, len end
  if len == 0 then return false end
  -- Every set the module writes has an expiry.
  if redis.call('PTTL', key) == -1 then
    return nil, redis.error_reply('WRONGTYPE the key holds a sorted set without an expiry, which no rate limiter writes')
  end
  local newest, err = concurrency_entry(key, 0, a.id, now)
  if newest == nil then return nil, err end
  local latest_other
  if newest and newest.own then
    local before
    before, err = concurrency_entry(key, 1, a.id, now)
    if before == nil then return nil, err end
    if before then latest_other = before.expiry end
  elseif newest then
    latest_other = newest.expiry
  end
  local live = redis.call('ZCOUNT', key, string.format('(%.17g', now), '+inf')
  local own = redis.call('ZSCORE', key, a.id)
  if own then
    own, err = concurrency_check(a.id, own, now)
    if not own then return nil, err end
  end
  return {len = len, live = live, own = own, latest_other = latest_other,
          latest = newest and newest.expiry}
end

-- Whole milliseconds from now until `at`, rounded up, never negative.
local function concurrency_ms_until(at, now)
  local ms = math.ceil((at - now) / 1000)
  if ms < 0 then return 0 end
  return ms
end

-- The reply, and what to store (nil when nothing is written); or nil and an error reply when
-- the entry a denial reads is corrupt.
function concurrency.decide(a, view, now, key)
  view = view or {len = 0, live = 0}
  local limit = a.limit
  local renews = view.own and view.own > now
  local allowed = renews or view.live < limit
  local admits = allowed and a.cost > 0
  local live_after = view.live
  if admits and not renews then live_after = live_after + 1 end
  local remaining = limit - live_after
  if remaining < 0 then remaining = 0 end
  local expiry = now + a.lease_us
  local retry_after = 0
  if not allowed then
    -- A slot is free once the lease `limit - 1` places before the newest has expired.
    local entry, err = concurrency_entry(key, limit - 1, a.id, now)
    if entry == nil then return nil, err end
    if entry then retry_after = concurrency_ms_until(entry.expiry, now) else retry_after = -1 end
  end
  local latest_after = view.latest
  if admits then
    latest_after = expiry
    if view.latest_other and view.latest_other > expiry then latest_after = view.latest_other end
  end
  local reset_after = 0
  if latest_after then reset_after = concurrency_ms_until(latest_after, now) end
  local write
  if admits then
    local trim = trim_count(view.len - view.live, 1)
    local err = concurrency_check_oldest(key, trim, now)
    if err then return nil, err end
    write = {trim = trim, id = a.id, expiry = expiry, expire_at = math.ceil(latest_after / 1000)}
  end
  return {allowed and 1 or 0, remaining, retry_after, reset_after, limit}, write
end

function concurrency.store(key, w)
  if w.trim > 0 then redis.call('ZREMRANGEBYRANK', key, '0', string.format('%.0f', w.trim - 1)) end
  redis.call('ZADD', key, string.format('%.17g', w.expiry), w.id)
  redis.call('PEXPIREAT', key, string.format('%.17g', w.expire_at))
end

-- Frees the call's lease if it is live (expired ones go too): 1, else 0 and no write; or nil
-- and an error reply when a lease it would remove is corrupt.
function concurrency.release(key, view, now, id)
  if not (view and view.own and view.own > now) then return 0 end
  local trim = trim_count(view.len - view.live, 0)
  local err = concurrency_check_oldest(key, trim, now)
  if err then return nil, err end
  if trim > 0 then
    redis.call('ZREMRANGEBYRANK', key, '0', string.format('%.0f', trim - 1))
  end
  redis.call('ZREM', key, id)
  if view.latest_other and view.latest_other > now then
    redis.call('PEXPIREAT', key, string.format('%.17g', math.ceil(view.latest_other / 1000)))
  end
  return 1
end
-- @end

-- @main
if #KEYS ~= 1 or #ARGV ~= 1 then
  return redis.error_reply("ERR wrong number of arguments for 'rl.release' command")
end
local id, err = concurrency.id_arg(ARGV[1])
if not id then return redis.error_reply(err) end
local now = now_us()
local state, load_err = concurrency.load(KEYS[1], {id = id}, now)
if state == nil then return load_err end
local released, release_err = concurrency.release(KEYS[1], state, now, id)
if released == nil then return release_err end
return released
