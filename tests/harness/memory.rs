//! An in-memory keyspace with a clock under the test's control, and an embedded Lua 5.1 that
//! runs the `lua-reference/` scripts against it through a `redis.call` shim.
//!
//! The shim is faithful where it matters for parity: Lua numbers passed to `redis.call` become
//! strings the way the server being modelled converts them (`NumberForm`: C's `%.17g` on Redis
//! 7.0, the shortest round-trip digits on Redis 7.2+ and Valkey),
//! replies become Lua values the way Redis converts them, `redis.call` raises errors and
//! `redis.pcall` returns them as `{err=...}`, and a returned Lua number becomes an integer by
//! truncation. Keys expire as in Redis: a key is gone once `now_ms > expire_at_ms`.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use mlua::{Function, Lua, Table, Value as LuaValue};
use redis_rate_limiter::codec::error::{ErrorReply, WRONGTYPE};
use redis_rate_limiter::codec::number::g17_string;
use redis_rate_limiter::store::{
    Effect, Entries, EntryVisitor, FieldName, Slot, Store, member_name,
};

#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    Hash(BTreeMap<Vec<u8>, Vec<u8>>),
    Str(Vec<u8>),
    /// A sorted set in Redis order: score, then member bytes.
    Zset(Zset),
}

/// Sorted-set entries `(score, member)`.
pub type Zset = Vec<(f64, Vec<u8>)>;

#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub data: Data,
    pub expire_at_ms: Option<i64>,
}

#[derive(Debug, Default, Clone, PartialEq)]
pub struct Keyspace {
    pub keys: HashMap<Vec<u8>, Entry>,
    pub now_us: i64,
}

impl Keyspace {
    pub fn now_ms(&self) -> i64 {
        self.now_us.div_euclid(1000)
    }

    /// Drops keys whose time has passed (Redis would on the next access; doing it for every key
    /// before a step makes the two keyspaces comparable whatever each path touched).
    pub fn expire_due(&mut self) {
        let now = self.now_ms();
        self.keys
            .retain(|_, e| e.expire_at_ms.is_none_or(|at| now <= at));
    }

    pub fn lookup(&mut self, key: &[u8]) -> Option<&mut Entry> {
        let now = self.now_ms();
        if self
            .keys
            .get(key)
            .is_some_and(|e| e.expire_at_ms.is_some_and(|at| now > at))
        {
            self.keys.remove(key);
        }
        self.keys.get_mut(key)
    }

    fn hash_mut(&mut self, key: &[u8]) -> Result<&mut BTreeMap<Vec<u8>, Vec<u8>>, ErrorReply> {
        if self.lookup(key).is_none() {
            self.keys.insert(
                key.to_vec(),
                Entry {
                    data: Data::Hash(BTreeMap::new()),
                    expire_at_ms: None,
                },
            );
        }
        match self.keys.get_mut(key).map(|e| &mut e.data) {
            Some(Data::Hash(h)) => Ok(h),
            _ => Err(WRONGTYPE),
        }
    }

    /// The commands the Lua twins use, with Redis's replies.
    pub fn command(&mut self, argv: &[Vec<u8>]) -> Reply {
        let name = String::from_utf8_lossy(&argv[0]).to_ascii_uppercase();
        let arg = |i: usize| argv.get(i).cloned().unwrap_or_default();
        let wrongtype = || Reply::Error(WRONGTYPE.message().to_string());
        match name.as_str() {
            "TIME" => Reply::Array(vec![
                Reply::Bulk(self.now_us.div_euclid(1_000_000).to_string().into_bytes()),
                Reply::Bulk(self.now_us.rem_euclid(1_000_000).to_string().into_bytes()),
            ]),
            "EXISTS" => Reply::Int(i64::from(self.lookup(&arg(1)).is_some())),
            "HLEN" => match self.lookup(&arg(1)).map(|e| &e.data) {
                None => Reply::Int(0),
                Some(Data::Hash(h)) => Reply::Int(h.len() as i64),
                Some(_) => wrongtype(),
            },
            // -2 for no key, -1 for no expiry, else the milliseconds left.
            "PTTL" => {
                let now = self.now_ms();
                match self.lookup(&arg(1)) {
                    None => Reply::Int(-2),
                    Some(Entry {
                        expire_at_ms: None, ..
                    }) => Reply::Int(-1),
                    Some(Entry {
                        expire_at_ms: Some(at),
                        ..
                    }) => Reply::Int(*at - now),
                }
            }
            "TYPE" => Reply::Status(
                match self.lookup(&arg(1)).map(|e| &e.data) {
                    None => "none",
                    Some(Data::Str(_)) => "string",
                    Some(Data::Hash(_)) => "hash",
                    Some(Data::Zset(_)) => "zset",
                }
                .to_string(),
            ),
            "HMGET" | "HGET" => {
                let fields = &argv[2..];
                let values: Vec<Reply> = match self.lookup(&arg(1)).map(|e| &e.data) {
                    None => fields.iter().map(|_| Reply::Nil).collect(),
                    Some(Data::Hash(h)) => fields
                        .iter()
                        .map(|f| h.get(f).map_or(Reply::Nil, |v| Reply::Bulk(v.clone())))
                        .collect(),
                    Some(_) => return wrongtype(),
                };
                if name == "HGET" {
                    values.into_iter().next().unwrap_or(Reply::Nil)
                } else {
                    Reply::Array(values)
                }
            }
            "HSET" => match self.hash_mut(&arg(1)) {
                Ok(h) => {
                    let mut added = 0;
                    for pair in argv[2..].chunks(2) {
                        if h.insert(pair[0].clone(), pair[1].clone()).is_none() {
                            added += 1;
                        }
                    }
                    Reply::Int(added)
                }
                Err(_) => wrongtype(),
            },
            "PEXPIREAT" => {
                let at: i64 = String::from_utf8_lossy(&arg(2))
                    .parse()
                    .expect("PEXPIREAT ms");
                let now = self.now_ms();
                match self.lookup(&arg(1)) {
                    None => Reply::Int(0),
                    Some(e) => {
                        e.expire_at_ms = Some(at);
                        if at <= now {
                            self.keys.remove(&arg(1));
                        }
                        Reply::Int(1)
                    }
                }
            }
            "GET" => match self.lookup(&arg(1)).map(|e| &e.data) {
                None => Reply::Nil,
                Some(Data::Str(v)) => Reply::Bulk(v.clone()),
                Some(_) => wrongtype(),
            },
            // SET key value [PXAT ms]: replaces any value and expiry, as Redis does.
            "SET" => {
                let expire_at_ms = match argv.get(3) {
                    None => None,
                    Some(opt) if opt.eq_ignore_ascii_case(b"PXAT") => Some(
                        String::from_utf8_lossy(&arg(4))
                            .parse::<i64>()
                            .expect("PXAT ms"),
                    ),
                    Some(_) => return Reply::Error("ERR syntax error in the test shim".into()),
                };
                self.keys.insert(
                    arg(1),
                    Entry {
                        data: Data::Str(arg(2)),
                        expire_at_ms,
                    },
                );
                Reply::Status("OK".into())
            }
            "ZADD" | "ZRANGE" | "ZREMRANGEBYSCORE" | "ZREMRANGEBYRANK" | "ZCARD" | "ZCOUNT"
            | "ZSCORE" | "ZREM" => self.zset_command(&name, argv),
            other => Reply::Error(format!("ERR unknown command '{other}' in the test shim")),
        }
    }
}

/// A reply from the in-memory keyspace.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Nil,
    Int(i64),
    Bulk(Vec<u8>),
    Array(Vec<Reply>),
    Error(String),
    Status(String),
}

/// The Rust pipeline's view of one key in the in-memory keyspace.
pub struct MemoryKey<'a> {
    pub space: &'a mut Keyspace,
    pub key: Vec<u8>,
}

/// How a server turns a Lua number passed to `redis.call` into the string it stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumberForm {
    /// Redis 7.0: C's `%.17g`.
    G17,
    /// Redis 7.2+ and Valkey: an integral value within ±2^62 as integer digits, any other the
    /// shortest digits that read back as the same double, laid out as `fpconv_dtoa` does
    /// (`1e-7`, `1e+21`, `0.30000000000000004`).
    Shortest,
}

impl NumberForm {
    pub const BOTH: [NumberForm; 2] = [NumberForm::G17, NumberForm::Shortest];

    pub fn text(self, v: f64) -> String {
        match self {
            NumberForm::G17 => g17_string(v),
            NumberForm::Shortest => shortest_text(v),
        }
    }
}

fn shortest_text(v: f64) -> String {
    let sign = if v.is_sign_negative() { "-" } else { "" };
    if v.is_nan() {
        return format!("{sign}nan");
    }
    if v.is_infinite() {
        return format!("{sign}inf");
    }
    // Redis's double2ll: integral and within ±(2^63 - 1) / 2 is printed as an integer (so -0 is 0).
    if v == v.trunc() && v.abs() <= 4_611_686_018_427_387_903.0 {
        return format!("{}", v as i64);
    }
    // Shortest round-trip digits and the exponent: v = digits * 10^k.
    let exponential = format!("{:e}", v.abs());
    let (mantissa, exponent) = exponential.split_once('e').expect("exponential form");
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let k = exponent.parse::<i32>().expect("exponent") - (digits.len() as i32 - 1);
    fpconv_layout(v.is_sign_negative(), &digits, k)
}

/// `digits * 10^k` laid out as `fpconv_dtoa` (Redis 7.2+, Valkey) does: plain digits up to 7
/// zeros past them, a decimal point for down to 6 places, else `d.ddde±x`.
pub fn fpconv_layout(negative: bool, digits: &str, k: i32) -> String {
    let n = digits.len() as i32;
    let exp = (k + n - 1).abs();
    let body = if k >= 0 && exp < n + 7 {
        format!("{digits}{}", "0".repeat(k as usize))
    } else if k < 0 && (k > -7 || exp < 4) {
        let offset = n + k;
        if offset <= 0 {
            format!("0.{}{digits}", "0".repeat((-offset) as usize))
        } else {
            let (int, frac) = digits.split_at(offset as usize);
            format!("{int}.{frac}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let dot = if rest.is_empty() { "" } else { "." };
        let exp_sign = if k + n - 1 < 0 { '-' } else { '+' };
        format!("{first}{dot}{rest}e{exp_sign}{exp}")
    };
    let sign = if negative { "-" } else { "" };
    format!("{sign}{body}")
}

/// The sign, significant digits and exponent of a decimal text: `-0.0125` is `(true, "125", -4)`.
pub fn decimal_parts(text: &str) -> (bool, String, i32) {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exp) = match unsigned.split_once('e') {
        Some((m, e)) => (m, e.parse::<i32>().expect("exponent")),
        None => (unsigned, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all = format!("{int}{frac}");
    let trimmed = all.trim_start_matches('0');
    let significant = trimmed.trim_end_matches('0');
    let trailing = (trimmed.len() - significant.len()) as i32;
    let k = exp - frac.len() as i32 + trailing;
    (negative, significant.to_string(), k)
}

const SHIM: &str = r#"
local backend, number_text = ...
local function strings(...)
  local out = {}
  for i = 1, select('#', ...) do
    local v = select(i, ...)
    if type(v) == 'number' then
      -- Redis 7.0's conversion is C's %.17g, which Lua's string.format is; another server's is
      -- modelled in Rust (NumberForm).
      if number_text then out[i] = number_text(v) else out[i] = string.format('%.17g', v) end
    elseif type(v) == 'string' then
      out[i] = v
    else
      error({err = 'ERR Lua redis lib command arguments must be strings or integers'})
    end
  end
  return out
end
redis = {}
function redis.call(...)
  local r = backend(strings(...))
  if type(r) == 'table' and r.err then error(r) end
  return r
end
function redis.pcall(...)
  return backend(strings(...))
end
function redis.error_reply(msg) return {err = msg} end
function redis.status_reply(msg) return {ok = msg} end
"#;

/// A Lua 5.1 interpreter with one script loaded, running against a shared in-memory keyspace.
pub struct LuaTwin {
    lua: Lua,
    script: Function,
    pub space: Rc<RefCell<Keyspace>>,
}

fn to_lua(lua: &Lua, reply: Reply) -> mlua::Result<LuaValue> {
    Ok(match reply {
        Reply::Nil => LuaValue::Boolean(false),
        Reply::Int(i) => LuaValue::Number(i as f64),
        Reply::Bulk(b) => LuaValue::String(lua.create_string(b)?),
        Reply::Array(items) => {
            let t = lua.create_table()?;
            for (i, item) in items.into_iter().enumerate() {
                t.raw_set(i + 1, to_lua(lua, item)?)?;
            }
            LuaValue::Table(t)
        }
        Reply::Error(msg) => {
            let t = lua.create_table()?;
            t.raw_set("err", msg)?;
            LuaValue::Table(t)
        }
        Reply::Status(msg) => {
            let t = lua.create_table()?;
            t.raw_set("ok", msg)?;
            LuaValue::Table(t)
        }
    })
}

/// What a script returned, as Redis would reply it: integers (numbers truncated) or an error.
pub type ScriptReply = Result<Vec<i64>, String>;

impl LuaTwin {
    /// A twin on a modelled Redis 7.0 (numbers passed to `redis.call` become `%.17g`).
    pub fn new(script_source: &str) -> LuaTwin {
        Self::with_form(script_source, NumberForm::G17)
    }

    pub fn with_form(script_source: &str, form: NumberForm) -> LuaTwin {
        Self::with_space(
            script_source,
            form,
            Rc::new(RefCell::new(Keyspace::default())),
        )
    }

    /// Another script on the same keyspace and number form (two twins that share keys).
    pub fn beside(&self, script_source: &str, form: NumberForm) -> LuaTwin {
        Self::with_space(script_source, form, Rc::clone(&self.space))
    }

    fn with_space(script_source: &str, form: NumberForm, space: Rc<RefCell<Keyspace>>) -> LuaTwin {
        let lua = Lua::new();
        let backend_space = Rc::clone(&space);
        let backend = lua
            .create_function(move |lua, args: Table| {
                let argv: Vec<Vec<u8>> = args
                    .sequence_values::<mlua::LuaString>()
                    .map(|s| s.map(|s| s.as_bytes().to_vec()))
                    .collect::<mlua::Result<_>>()?;
                let reply = backend_space.borrow_mut().command(&argv);
                to_lua(lua, reply)
            })
            .expect("backend function");
        let number_text = match form {
            NumberForm::G17 => None,
            NumberForm::Shortest => Some(
                lua.create_function(move |_, v: f64| Ok(form.text(v)))
                    .expect("number function"),
            ),
        };
        lua.load(SHIM)
            .call::<()>((backend, number_text))
            .expect("shim loads");
        let script = lua
            .load(script_source)
            .into_function()
            .expect("script compiles");
        LuaTwin { lua, script, space }
    }

    /// `EVALSHA <script> 1 key args...` at the keyspace's current time.
    pub fn eval(&self, key: &[u8], args: &[Vec<u8>]) -> ScriptReply {
        let keys = self.lua.create_table().expect("table");
        keys.raw_set(1, self.lua.create_string(key).expect("string"))
            .expect("set");
        let argv = self.lua.create_table().expect("table");
        for (i, a) in args.iter().enumerate() {
            argv.raw_set(i + 1, self.lua.create_string(a).expect("string"))
                .expect("set");
        }
        let globals = self.lua.globals();
        globals.set("KEYS", keys).expect("KEYS");
        globals.set("ARGV", argv).expect("ARGV");
        match self.script.call::<LuaValue>(()) {
            Ok(LuaValue::Table(t)) => {
                if let Ok(LuaValue::String(e)) = t.raw_get::<LuaValue>("err") {
                    return Err(e.to_string_lossy());
                }
                Ok(t.sequence_values::<LuaValue>()
                    .map(|v| match v.expect("reply element") {
                        LuaValue::Integer(i) => i,
                        LuaValue::Number(n) => n as i64,
                        other => panic!("non-numeric reply element {other:?}"),
                    })
                    .collect())
            }
            // An integer reply (RL.RELEASE's).
            Ok(LuaValue::Integer(i)) => Ok(vec![i]),
            Ok(LuaValue::Number(n)) => Ok(vec![n as i64]),
            Ok(other) => panic!("script returned {other:?}"),
            Err(e) => Err(format!("script raised: {e}")),
        }
    }
}

/// The named fields of a hash (all `None` for any other value): the earlier layout's reader.
fn hash_fields(data: Option<&Data>, names: &[&'static FieldName], out: &mut [Option<Vec<u8>>]) {
    let hash = match data {
        Some(Data::Hash(h)) => Some(h),
        _ => None,
    };
    for (slot, name) in out.iter_mut().zip(names) {
        *slot = hash.and_then(|h| h.get(name.name.to_bytes()).cloned());
    }
}

/// One key of a keyspace shared by several open keys at once (multi-limit calls). A call reads
/// every key before it writes any, so each key reads the value it had when it was opened.
pub struct SharedKey<'a> {
    space: &'a RefCell<Keyspace>,
    key: Vec<u8>,
    opened: Option<Data>,
    opened_expiry: Option<i64>,
}

impl<'a> SharedKey<'a> {
    pub fn open(space: &'a RefCell<Keyspace>, key: &[u8]) -> SharedKey<'a> {
        let opened = space.borrow_mut().lookup(key).cloned();
        SharedKey {
            space,
            key: key.to_vec(),
            opened_expiry: opened.as_ref().and_then(|e| e.expire_at_ms),
            opened: opened.map(|e| e.data),
        }
    }
}

impl Store for SharedKey<'_> {
    fn read(&self) -> Result<Slot<'_>, ErrorReply> {
        Ok(slot(self.opened.as_ref()))
    }

    fn legacy_fields(
        &self,
        names: &[&'static FieldName],
        out: &mut [Option<Vec<u8>>],
    ) -> Result<(), ErrorReply> {
        hash_fields(self.opened.as_ref(), names, out);
        Ok(())
    }

    fn zset_len(&self) -> Result<i64, ErrorReply> {
        Ok(zset_of(self.opened.as_ref()).len() as i64)
    }

    fn zset_count(&self, min: f64, min_inclusive: bool, max: f64) -> Result<i64, ErrorReply> {
        Ok(count_in(
            zset_of(self.opened.as_ref()),
            min,
            min_inclusive,
            max,
        ))
    }

    fn zset_from_last(&self, rank: i64, visit: &mut EntryVisitor<'_>) -> Result<bool, ErrorReply> {
        from_last(zset_of(self.opened.as_ref()), rank, visit)
    }

    fn zset_score(&self, member: &[u8]) -> Result<Option<f64>, ErrorReply> {
        Ok(score_of(zset_of(self.opened.as_ref()), member))
    }

    fn zset_first(&self, count: i64, visit: &mut EntryVisitor<'_>) -> Result<(), ErrorReply> {
        for (score, member) in zset_of(self.opened.as_ref())
            .iter()
            .take(usize::try_from(count).unwrap_or(0))
        {
            visit(member, *score)?;
        }
        Ok(())
    }

    fn hash_len(&self) -> Result<i64, ErrorReply> {
        Ok(match self.opened.as_ref() {
            Some(Data::Hash(h)) => h.len() as i64,
            _ => 0,
        })
    }

    fn has_expiry(&self) -> Result<bool, ErrorReply> {
        Ok(self.opened_expiry.is_some())
    }

    fn writable(&self) -> Result<(), ErrorReply> {
        Ok(())
    }

    fn apply(&mut self, effect: &Effect<'_>) -> Result<(), ErrorReply> {
        MemoryKey {
            space: &mut self.space.borrow_mut(),
            key: self.key.clone(),
        }
        .apply(effect)
    }
}

/// What a stored value is, as a limiter reads it.
fn slot(data: Option<&Data>) -> Slot<'_> {
    match data {
        None => Slot::Empty,
        Some(Data::Str(v)) => Slot::Value(v),
        Some(Data::Hash(_)) => Slot::Hash,
        Some(Data::Zset(_)) => Slot::Zset,
    }
}

/// The entries of a sorted set (none for any other value).
fn zset_of(data: Option<&Data>) -> &[(f64, Vec<u8>)] {
    match data {
        Some(Data::Zset(z)) => z,
        _ => &[],
    }
}

/// Entries with `min < score <= max` (`min <=` when inclusive): the set is sorted by score.
fn count_in(z: &[(f64, Vec<u8>)], min: f64, min_inclusive: bool, max: f64) -> i64 {
    let from = z.partition_point(|(s, _)| if min_inclusive { *s < min } else { *s <= min });
    let to = z.partition_point(|(s, _)| *s <= max);
    to.saturating_sub(from) as i64
}

fn score_of(z: &[(f64, Vec<u8>)], member: &[u8]) -> Option<f64> {
    z.iter().find(|(_, m)| m == member).map(|(s, _)| *s)
}

fn from_last(
    z: &[(f64, Vec<u8>)],
    rank: i64,
    visit: &mut EntryVisitor<'_>,
) -> Result<bool, ErrorReply> {
    let i = z.len() as i64 - 1 - rank;
    match usize::try_from(i).ok().and_then(|i| z.get(i)) {
        Some((score, member)) if rank >= 0 => {
            visit(member, *score)?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

fn flatten(value: LuaValue, out: &mut Vec<i64>) {
    match value {
        LuaValue::Integer(i) => out.push(i),
        LuaValue::Number(n) => out.push(n as i64),
        LuaValue::Table(t) => {
            for v in t.sequence_values::<LuaValue>() {
                flatten(v.expect("reply element"), out);
            }
        }
        other => panic!("unexpected reply element {other:?}"),
    }
}

impl LuaTwin {
    /// `EVALSHA <script> <numkeys> keys... args...`; nested array replies are flattened.
    pub fn eval_keys(&self, keys: &[Vec<u8>], args: &[Vec<u8>]) -> ScriptReply {
        let table = |items: &[Vec<u8>]| {
            let t = self.lua.create_table().expect("table");
            for (i, a) in items.iter().enumerate() {
                t.raw_set(i + 1, self.lua.create_string(a).expect("string"))
                    .expect("set");
            }
            t
        };
        let globals = self.lua.globals();
        globals.set("KEYS", table(keys)).expect("KEYS");
        globals.set("ARGV", table(args)).expect("ARGV");
        match self.script.call::<LuaValue>(()) {
            Ok(LuaValue::Table(t)) => {
                if let Ok(LuaValue::String(e)) = t.raw_get::<LuaValue>("err") {
                    return Err(e.to_string_lossy());
                }
                let mut out = Vec::new();
                flatten(LuaValue::Table(t), &mut out);
                Ok(out)
            }
            Ok(other) => panic!("script returned {other:?}"),
            Err(e) => Err(format!("script raised: {e}")),
        }
    }
}

impl MemoryKey<'_> {
    fn live_expiry(&self) -> Option<i64> {
        self.live()
            .and_then(|_| self.space.keys.get(&self.key))
            .and_then(|e| e.expire_at_ms)
    }

    /// `ZREMRANGEBYRANK key 0 count-1`: the oldest `count` entries leave (when above 0).
    fn trim_oldest(&mut self, count: i64) -> Result<(), ErrorReply> {
        if count <= 0 {
            return Ok(());
        }
        let argv = vec![
            b"ZREMRANGEBYRANK".to_vec(),
            self.key.clone(),
            b"0".to_vec(),
            (count - 1).to_string().into_bytes(),
        ];
        match self.space.command(&argv) {
            Reply::Error(_) => Err(WRONGTYPE),
            _ => Ok(()),
        }
    }

    fn live(&self) -> Option<&Data> {
        let now = self.space.now_ms();
        match self.space.keys.get(&self.key) {
            Some(e) if e.expire_at_ms.is_none_or(|at| now <= at) => Some(&e.data),
            _ => None,
        }
    }

    /// Trims, then adds the entries with `ZADD` (as the replicated commands do), then sets the
    /// expiry.
    fn append(&mut self, e: &Entries, expire_at_ms: i64) -> Result<(), ErrorReply> {
        self.trim_oldest(e.trim)?;
        let mut name = Vec::new();
        let mut argv = vec![b"ZADD".to_vec(), self.key.clone()];
        for i in e.first_index..e.first_index + e.count {
            member_name(e.score, i, &mut name);
            argv.push(g17_string(e.score).into_bytes());
            argv.push(name.clone());
        }
        if let Reply::Error(_) = self.space.command(&argv) {
            return Err(WRONGTYPE);
        }
        if let Some(entry) = self.space.keys.get_mut(&self.key) {
            entry.expire_at_ms = Some(expire_at_ms);
        }
        Ok(())
    }
}

impl MemoryKey<'_> {
    /// Trims, then `ZADD key expiry id` or `ZREM key id`, then sets the expiry (as the replicated
    /// commands do).
    fn lease(
        &mut self,
        trim: i64,
        id: &[u8],
        expiry: Option<f64>,
        expire_at_ms: Option<i64>,
    ) -> Result<(), ErrorReply> {
        let run = |space: &mut Keyspace, argv: Vec<Vec<u8>>| match space.command(&argv) {
            Reply::Error(_) => Err(WRONGTYPE),
            _ => Ok(()),
        };
        self.trim_oldest(trim)?;
        let argv = match expiry {
            Some(e) => vec![
                b"ZADD".to_vec(),
                self.key.clone(),
                g17_string(e).into_bytes(),
                id.to_vec(),
            ],
            None => vec![b"ZREM".to_vec(), self.key.clone(), id.to_vec()],
        };
        run(self.space, argv)?;
        if let (Some(at), Some(entry)) = (expire_at_ms, self.space.keys.get_mut(&self.key)) {
            entry.expire_at_ms = Some(at);
        }
        Ok(())
    }
}

impl Store for MemoryKey<'_> {
    fn read(&self) -> Result<Slot<'_>, ErrorReply> {
        Ok(slot(self.live()))
    }

    fn legacy_fields(
        &self,
        names: &[&'static FieldName],
        out: &mut [Option<Vec<u8>>],
    ) -> Result<(), ErrorReply> {
        hash_fields(self.live(), names, out);
        Ok(())
    }

    fn zset_len(&self) -> Result<i64, ErrorReply> {
        Ok(zset_of(self.live()).len() as i64)
    }

    fn zset_count(&self, min: f64, min_inclusive: bool, max: f64) -> Result<i64, ErrorReply> {
        Ok(count_in(zset_of(self.live()), min, min_inclusive, max))
    }

    fn zset_from_last(&self, rank: i64, visit: &mut EntryVisitor<'_>) -> Result<bool, ErrorReply> {
        from_last(zset_of(self.live()), rank, visit)
    }

    fn zset_score(&self, member: &[u8]) -> Result<Option<f64>, ErrorReply> {
        Ok(score_of(zset_of(self.live()), member))
    }

    fn zset_first(&self, count: i64, visit: &mut EntryVisitor<'_>) -> Result<(), ErrorReply> {
        for (score, member) in zset_of(self.live())
            .iter()
            .take(usize::try_from(count).unwrap_or(0))
        {
            visit(member, *score)?;
        }
        Ok(())
    }

    fn hash_len(&self) -> Result<i64, ErrorReply> {
        Ok(match self.live() {
            Some(Data::Hash(h)) => h.len() as i64,
            _ => 0,
        })
    }

    fn has_expiry(&self) -> Result<bool, ErrorReply> {
        Ok(self.live_expiry().is_some())
    }

    fn writable(&self) -> Result<(), ErrorReply> {
        Ok(())
    }

    fn apply(&mut self, effect: &Effect<'_>) -> Result<(), ErrorReply> {
        match effect {
            Effect::Set {
                value,
                expire_at_ms,
            } => {
                self.space.keys.insert(
                    self.key.clone(),
                    Entry {
                        data: Data::Str(value.to_vec()),
                        expire_at_ms: Some(*expire_at_ms),
                    },
                );
                Ok(())
            }
            Effect::Append {
                entries,
                expire_at_ms,
            } => self.append(entries, *expire_at_ms),
            Effect::Lease {
                trim,
                id,
                expiry,
                expire_at_ms,
            } => self.lease(*trim, id, *expiry, *expire_at_ms),
            Effect::Pop {
                trim,
                count,
                expire_at_ms,
            } => {
                self.trim_oldest(*trim)?;
                let argv = vec![
                    b"ZREMRANGEBYRANK".to_vec(),
                    self.key.clone(),
                    (-count).to_string().into_bytes(),
                    b"-1".to_vec(),
                ];
                if let Reply::Error(_) = self.space.command(&argv) {
                    return Err(WRONGTYPE);
                }
                if let (Some(at), Some(entry)) = (expire_at_ms, self.space.keys.get_mut(&self.key))
                {
                    entry.expire_at_ms = Some(*at);
                }
                Ok(())
            }
        }
    }
}

/// A score as Redis parses one (`strtod`: also `inf`, `-inf`, `+inf`); NaN is refused.
pub fn parse_score(raw: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(raw).ok()?;
    let v: f64 = match text.to_ascii_lowercase().as_str() {
        "inf" | "+inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        t if t.contains("inf") || t.contains("nan") => return None,
        t => t.parse().ok()?,
    };
    (!v.is_nan()).then_some(v)
}

/// A `ZRANGEBYSCORE`-style bound: `(x` is exclusive.
fn parse_bound(raw: &[u8]) -> Option<(f64, bool)> {
    match raw.split_first() {
        Some((b'(', rest)) => parse_score(rest).map(|v| (v, true)),
        _ => parse_score(raw).map(|v| (v, false)),
    }
}

/// Redis order of sorted-set entries.
pub fn zset_order(a: &(f64, Vec<u8>), b: &(f64, Vec<u8>)) -> std::cmp::Ordering {
    a.0.partial_cmp(&b.0)
        .unwrap_or(std::cmp::Ordering::Equal)
        .then_with(|| a.1.cmp(&b.1))
}

impl Keyspace {
    /// The sorted set at `key` (`None` for a missing key), or WRONGTYPE.
    fn zset_mut(&mut self, key: &[u8]) -> Result<Option<&mut Zset>, Reply> {
        match self.lookup(key).map(|e| &mut e.data) {
            None => Ok(None),
            Some(Data::Zset(z)) => Ok(Some(z)),
            Some(_) => Err(Reply::Error(WRONGTYPE.message().to_string())),
        }
    }

    /// `ZADD key score member ...`, `ZRANGE key start stop [REV] [WITHSCORES]`, `ZCOUNT key min max`,
    /// `ZREMRANGEBYSCORE key min max`, `ZCARD key`, with Redis's replies.
    fn zset_command(&mut self, name: &str, argv: &[Vec<u8>]) -> Reply {
        let key = argv.get(1).cloned().unwrap_or_default();
        let syntax = || Reply::Error("ERR syntax error".to_string());
        match name {
            "ZADD" => {
                let pairs = &argv[2..];
                if pairs.is_empty() || !pairs.len().is_multiple_of(2) {
                    return syntax();
                }
                let mut parsed = Vec::new();
                for pair in pairs.chunks(2) {
                    match parse_score(&pair[0]) {
                        Some(s) => parsed.push((s, pair[1].clone())),
                        None => return Reply::Error("ERR value is not a valid float".to_string()),
                    }
                }
                let z = match self.zset_mut(&key) {
                    Err(e) => return e,
                    Ok(Some(z)) => z,
                    Ok(None) => {
                        self.keys.insert(
                            key.clone(),
                            Entry {
                                data: Data::Zset(Vec::new()),
                                expire_at_ms: None,
                            },
                        );
                        match self.keys.get_mut(&key).map(|e| &mut e.data) {
                            Some(Data::Zset(z)) => z,
                            _ => unreachable!(),
                        }
                    }
                };
                // Later pairs win for a repeated member, as in Redis; one sort for the batch.
                let mut latest: HashMap<Vec<u8>, f64> = HashMap::new();
                for (score, member) in parsed {
                    latest.insert(member, score);
                }
                let before = z.len();
                z.retain(|(_, m)| !latest.contains_key(m));
                let mut added: Vec<(f64, Vec<u8>)> =
                    latest.into_iter().map(|(m, s)| (s, m)).collect();
                added.sort_by(zset_order);
                // New entries after every stored one (a log's usual write) need no merge.
                let after_all = match (z.last(), added.first()) {
                    (Some(last), Some(first)) => zset_order(last, first).is_lt(),
                    _ => true,
                };
                z.extend(added);
                if !after_all {
                    z.sort_by(zset_order);
                }
                Reply::Int((z.len() - before) as i64)
            }
            "ZSCORE" => match self.zset_mut(&key) {
                Err(e) => e,
                Ok(z) => match z.and_then(|z| score_of(z, argv.get(2).map_or(&b""[..], |m| m))) {
                    Some(s) => Reply::Bulk(g17_string(s).into_bytes()),
                    None => Reply::Nil,
                },
            },
            "ZREM" => {
                let members = argv.get(2..).unwrap_or_default();
                let z = match self.zset_mut(&key) {
                    Err(e) => return e,
                    Ok(None) => return Reply::Int(0),
                    Ok(Some(z)) => z,
                };
                let before = z.len();
                z.retain(|(_, m)| !members.contains(m));
                let removed = (before - z.len()) as i64;
                if z.is_empty() {
                    self.keys.remove(&key);
                }
                Reply::Int(removed)
            }
            "ZREMRANGEBYRANK" => {
                let int = |i: usize| {
                    String::from_utf8_lossy(argv.get(i).map_or(&b""[..], |v| v))
                        .parse::<i64>()
                        .ok()
                };
                let (Some(start), Some(stop)) = (int(2), int(3)) else {
                    return Reply::Error("ERR value is not an integer or out of range".to_string());
                };
                let z = match self.zset_mut(&key) {
                    Err(e) => return e,
                    Ok(None) => return Reply::Int(0),
                    Ok(Some(z)) => z,
                };
                let len = z.len() as i64;
                let norm = |i: i64| if i < 0 { (len + i).max(0) } else { i };
                let (from, to) = (norm(start), norm(stop).min(len - 1));
                let removed = if from <= to {
                    z.drain(from as usize..=to as usize).count() as i64
                } else {
                    0
                };
                if z.is_empty() {
                    self.keys.remove(&key);
                }
                Reply::Int(removed)
            }
            "ZCARD" => match self.zset_mut(&key) {
                Err(e) => e,
                Ok(z) => Reply::Int(z.map_or(0, |z| z.len() as i64)),
            },
            "ZRANGE" => {
                let int = |i: usize| {
                    String::from_utf8_lossy(argv.get(i).map_or(&b""[..], |v| v))
                        .parse::<i64>()
                        .expect("ZRANGE index")
                };
                let (start, stop) = (int(2), int(3));
                let option = |name: &[u8]| {
                    argv.get(4..)
                        .is_some_and(|o| o.iter().any(|a| a.eq_ignore_ascii_case(name)))
                };
                let (with_scores, rev) = (option(b"withscores"), option(b"rev"));
                let z = match self.zset_mut(&key) {
                    Err(e) => return e,
                    Ok(None) => return Reply::Array(Vec::new()),
                    Ok(Some(z)) => z,
                };
                let len = z.len() as i64;
                let norm = |i: i64| if i < 0 { (len + i).max(0) } else { i };
                let (from, to) = (norm(start), norm(stop).min(len - 1));
                let mut out = Vec::new();
                if from <= to {
                    // REV counts ranks from the last entry and lists them last first.
                    let picked: Vec<&(f64, Vec<u8>)> = if rev {
                        z.iter()
                            .rev()
                            .skip(from as usize)
                            .take((to - from + 1) as usize)
                            .collect()
                    } else {
                        z[from as usize..=to as usize].iter().collect()
                    };
                    for (score, member) in picked {
                        out.push(Reply::Bulk(member.clone()));
                        if with_scores {
                            out.push(Reply::Bulk(g17_string(*score).into_bytes()));
                        }
                    }
                }
                Reply::Array(out)
            }
            "ZCOUNT" => {
                let (Some((min, min_ex)), Some((max, max_ex))) = (
                    argv.get(2).and_then(|b| parse_bound(b)),
                    argv.get(3).and_then(|b| parse_bound(b)),
                ) else {
                    return Reply::Error("ERR min or max is not a float".to_string());
                };
                match self.zset_mut(&key) {
                    Err(e) => e,
                    Ok(None) => Reply::Int(0),
                    Ok(Some(z)) => Reply::Int(
                        z.iter()
                            .filter(|(s, _)| {
                                (if min_ex { *s > min } else { *s >= min })
                                    && (if max_ex { *s < max } else { *s <= max })
                            })
                            .count() as i64,
                    ),
                }
            }
            "ZREMRANGEBYSCORE" => {
                let (Some((min, min_ex)), Some((max, max_ex))) = (
                    argv.get(2).and_then(|b| parse_bound(b)),
                    argv.get(3).and_then(|b| parse_bound(b)),
                ) else {
                    return Reply::Error("ERR min or max is not a float".to_string());
                };
                let z = match self.zset_mut(&key) {
                    Err(e) => return e,
                    Ok(None) => return Reply::Int(0),
                    Ok(Some(z)) => z,
                };
                let before = z.len();
                z.retain(|(s, _)| {
                    let above_min = if min_ex { *s > min } else { *s >= min };
                    let below_max = if max_ex { *s < max } else { *s <= max };
                    !(above_min && below_max)
                });
                let removed = (before - z.len()) as i64;
                if z.is_empty() {
                    self.keys.remove(&key);
                }
                Reply::Int(removed)
            }
            _ => syntax(),
        }
    }
}
