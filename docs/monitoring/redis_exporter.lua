-- The rate limiter's counters and its most-denied keys, for redis_exporter's `-script` option
-- (docs/monitoring.md). redis_exporter runs this with `EVAL <script> 0 0` on every scrape and
-- exports each name, value pair it returns as redis_script_values{key="<name>"} <value>. Every
-- name and value must be a string (a value a number in it): one integer in the reply, or an
-- error, fails the whole scrape (redis_up 0). Hence strings only, and pcall.
--
-- Returned:
--   every `name:number` line of INFO ratelimit (the sections ratelimit_counters and
--   ratelimit_top): ratelimit_rl_tokenbucket_calls, ..._allowed, ..._denied, ..._errors,
--   ..._args, ..._wrongtype, ..._corrupt, ..._oom, ..._internal for each command, and
--   ratelimit_top_slots, ratelimit_top_keys, ratelimit_top_bytes;
--   for each of the TOP keys RL.TOP lists first, ratelimit_top_denied:<key> with its denials
--   (bytes of the key outside printable ASCII, and %, written as %XX).
-- A server without the module returns nothing; the exporter's user needs +info and +rl.top.

local TOP = 10

local out = {}

local info = redis.pcall('INFO', 'ratelimit')
if type(info) == 'string' then
  for line in string.gmatch(info, '[^\r\n]+') do
    local name, value = string.match(line, '^([%w_]+):(%d+)$')
    if name then
      out[#out + 1] = name
      out[#out + 1] = value
    end
  end
end

local function label(key)
  return (string.gsub(key, '[%%%c\128-\255]', function(c)
    return string.format('%%%02X', string.byte(c))
  end))
end

local top = redis.pcall('RL.TOP', TOP)
if type(top) == 'table' and top.err == nil then
  for _, entry in ipairs(top) do
    out[#out + 1] = 'ratelimit_top_denied:' .. label(entry[1])
    out[#out + 1] = tostring(entry[2])
  end
end

return out
