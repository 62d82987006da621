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

-- A token bucket's tokens: a finite decimal of either sign (negative for a debt, RL.SETTLE).
local function stored_balance(s)
  local v = s and is_decimal(s) and tonumber(s)
  if v and v > -math.huge and v < math.huge then return v end
  return nil
end

local function stored_timestamp(s)
  local v = s and is_integer(s) and tonumber(s)
  if v and v >= 0 and v <= MAX_TIMESTAMP_US then return v end
  return nil
end

-- The numbers of a limiter's state: false for a missing key, nil and an error reply for a key
-- of another type (Redis's own WRONGTYPE), else the list of values (false where absent). The
-- state is one string, its numbers separated by single spaces and split at the first n - 1 of
-- them (the last part keeps the rest). A hash with one field per number, the layout of release
-- 0.1, is read too; the next write replaces it with the string.
local FIELDS_SPLIT = {'^(.*)$', '^([^ ]*) (.*)$', '^([^ ]*) ([^ ]*) (.*)$'}
local function load_fields(key, ...)
  local n = select('#', ...)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' then
    if redis.call('TYPE', key)['ok'] ~= 'hash' then return nil, v end
    return redis.call('HMGET', key, ...)
  end
  if not v then return false end
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

-- Stores the numbers as that one string, each as '%.17g' (C's formatting, the same on every
-- server), with an absolute expiry in milliseconds: a single SET. The expiry is an integer, which
-- every server passes on as its digits.
local FIELDS_FORMAT = {'%.17g', '%.17g %.17g', '%.17g %.17g %.17g'}
local function store_fields(key, expire_at, ...)
  redis.call('SET', key, string.format(FIELDS_FORMAT[select('#', ...)], ...), 'PXAT', expire_at)
end

-- A settlement's reply (RL.SETTLE): the state after, as a peek reports it, admitted and with
-- nothing to wait for.
local function settled(reply)
  reply[1], reply[3] = 1, 0
  return reply
end

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- @end

-- @limiter sliding_log
local sliding_log = {
  ARITY = "ERR wrong number of arguments for 'rl.slidinglog' command",
  -- Every admitted unit is one member of about 120 bytes: this bounds a key's memory.
  MAX_LIMIT = 100000,
  MAX_WINDOW_SECONDS = 1e10,
  -- Members per ZADD call: unpack() returns fewer than 8000 results (Lua's C stack limit).
  ZADD_BATCH = 2000,
}

function sliding_log.parse(argv)
  if #argv < 2 or #argv > 3 then return nil, sliding_log.ARITY end
  local limit, cost, err
  limit, err = integer_arg(argv[1], 1, sliding_log.MAX_LIMIT,
    'ERR limit must be an integer', 'ERR limit must be between 1 and 100000')
  if not limit then return nil, err end
  if not is_decimal(argv[2]) then return nil, 'ERR window_sec must be a number' end
  local window_sec = tonumber(argv[2])
  if not (window_sec > 0 and window_sec <= sliding_log.MAX_WINDOW_SECONDS) then
    return nil, 'ERR window_sec must be greater than 0 and at most 10000000000'
  end
  -- Millisecond resolution, rounded half up.
  local window_ms = math.floor(window_sec * 1000 + 0.5)
  if window_ms < 1 then return nil, 'ERR window_sec must be at least 1 millisecond' end
  cost, err = cost_arg(argv[3])
  if not cost then return nil, err end
  return {limit = limit, window_ms = window_ms, window_us = window_ms * 1000, cost = cost}
end

-- The score of the entry `rank` places before the newest (0 is the newest), checked: an integer
-- score in [0, 2^53] and the member "<score>:<n>". False past the oldest, or nil and an error.
local function sliding_log_entry(key, rank)
  local entry = redis.call('ZRANGE', key, rank, rank, 'REV', 'WITHSCORES')
  if #entry == 0 then return false end
  local score = stored_timestamp(entry[2])
  if not score then
    return nil, redis.error_reply('ERR corrupt rate limiter state: sorted set score is not a valid timestamp')
  end
  local t = string.match(entry[1], '^(%d+):%d+$')
  if not t or tonumber(t) ~= score then
    return nil, redis.error_reply("ERR corrupt rate limiter state: sorted set member is not '<score>:<n>'")
  end
  return score
end

-- What a call needs to know of the log, each in O(log n): its length, the newest entry (the one
-- entry every call checks), how many entries are still in the window, and how many share the
-- newest score when new entries would join them. False for a new key, or nil and an error reply.
function sliding_log.load(key, a, now)
  local len = redis.pcall('ZCARD', key)
  if type(len) == 'table' then return nil, len end
  if len == 0 then return false end
  local newest, err = sliding_log_entry(key, 0)
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
    local score, err = sliding_log_entry(key, limit - cost)
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
    local trim
    if view.len > count then trim = now - a.window_us end
    write = {trim = trim, t = t, first = view.tied, count = cost,
             expire_at = math.ceil(t / 1000) + a.window_ms}
  end
  return {allowed and 1 or 0, remaining, retry_after, reset_after, limit}, write
end

-- RL.SETTLE: delta units refunded (negative: the newest entries still in the window leave, at
-- most as many as there are) or charged (positive: entries join at the call time, at most limit
-- of them) without an admission check. The reply, and what to store (nil when nothing changes);
-- or nil and an error reply when an entry it reads is corrupt.
function sliding_log.settle(a, view, now, delta, key)
  local limit = a.limit
  view = view or {len = 0, count = 0, tied = 0}
  local count = view.count
  local trim
  if view.len > count then trim = now - a.window_us end
  local count_after, newest, write = count, nil, nil
  if count > 0 then newest = view.newest end
  if delta > 0 then
    local t = now
    if view.newest and view.newest > now then t = view.newest end
    local added = delta
    if added > limit then added = limit end
    write = {trim = trim, t = t, first = view.tied, count = added,
             expire_at = math.ceil(t / 1000) + a.window_ms}
    count_after, newest = count + added, t
  elseif delta < 0 and count > 0 then
    local dropped = -delta
    if dropped > count then dropped = count end
    local next = false
    if dropped < count then
      local err
      next, err = sliding_log_entry(key, dropped)
      if next == nil then return nil, err end
    end
    local expire_at
    if next then expire_at = math.ceil(next / 1000) + a.window_ms end
    write = {trim = trim, drop = dropped, expire_at = expire_at}
    count_after, newest = count - dropped, next or nil
  end
  local reset_after = 0
  if newest and count_after > 0 then reset_after = sliding_log_leaves_after(a, newest, now) end
  local remaining = limit - count_after
  if remaining < 0 then remaining = 0 end
  return {1, remaining, 0, reset_after, limit}, write
end

function sliding_log.store(key, w)
  if w.trim then redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', w.trim)) end
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
local args, err = sliding_log.parse(ARGV)
if not args then return redis.error_reply(err) end
local now = now_us()
local state, load_err = sliding_log.load(KEYS[1], args, now)
if state == nil then return load_err end
local reply, write = sliding_log.decide(args, state, now, KEYS[1])
if not reply then return write end
if write then sliding_log.store(KEYS[1], write) end
return reply
