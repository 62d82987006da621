-- Sliding log, the Lua twin of RL.SLIDINGLOG.
--
--   EVALSHA <sha> 1 <key> <limit> <window_sec> [cost]
--
-- Reply: {allowed, remaining, retry_after_ms, reset_after_ms, limit}, errors word for word as
-- the module's. State: a sorted set with one member "<t>:<i>" per admitted unit of cost, at score
-- t (unix microseconds), and an absolute expiry when the newest entry leaves the window. Every
-- number is computed in the same order as src/core/sliding_log.rs; integers are formatted with
-- '%.0f' (tostring would use '%.14g'), so both paths store the same bytes.
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
if #KEYS ~= 1 then return redis.error_reply(sliding_log.ARITY) end
local args, err = parse_call(sliding_log, ARGV)
if not args then return redis.error_reply(err) end
local now = now_us()
local state, load_err = sliding_log.load(KEYS[1], args, now)
if state == nil then return load_err end
local reply, write = decide_call(sliding_log, args, state, now, KEYS[1])
if not reply then return write end
if write then sliding_log.store(KEYS[1], write) end
return reply
