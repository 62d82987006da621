//! Generated call sequences for the differential suites: arguments (valid and not), time steps
//! (zero, one microsecond, seconds, days, backwards) and corruptions of the stored state.
#![allow(dead_code)]

use proptest::prelude::*;

/// Something done to the stored key between two calls, identically on both paths. On a string
/// of numbers, a field is the part at its position in the limiter's field list; on a hash (the
/// earlier layout), the field of that name.
#[derive(Debug, Clone)]
pub enum Corruption {
    SetField(&'static str, String),
    DeleteField(&'static str),
    DeleteKey,
    MakeString,
    /// Rewrites a string of numbers in the earlier layout: a hash, one field per number, the
    /// expiry kept (as a key written by release 0.1 would be).
    ToLegacyHash,
    /// Replaces the key with a sorted set (a type no limiter of strings reads).
    MakeZset,
    /// Sets a field to the call's time plus this many microseconds (a clock ahead, by less or
    /// more than the skew a limiter accepts).
    SetFieldAhead(&'static str, i64),
    /// Replaces a string's tag (the first word) with this one, or removes it (`""`: the layout
    /// from before tags).
    Retag(&'static str),
    /// Adds a field no limiter writes to a hash of the earlier layout.
    ExtraHashField,
}

/// Whether a word is a tag (lower-case letters), as the first word of a stored value.
fn is_tag(word: &str) -> bool {
    !word.is_empty() && word.bytes().all(|b| b.is_ascii_lowercase())
}

/// A string of numbers after `SetField`, `DeleteField` or `Retag` (`None` for the other
/// corruptions); a tag stays where it is, and fields count after it. `now_us` is the time of the
/// call that follows (for `SetFieldAhead`).
pub fn corrupted_value(
    value: &str,
    c: &Corruption,
    fields: &[&str],
    now_us: i64,
) -> Option<String> {
    let mut parts: Vec<String> = value.split(' ').map(str::to_string).collect();
    let tagged = parts.len() > 1 && is_tag(&parts[0]);
    let skip = usize::from(tagged);
    let index = |name: &str, len: usize| {
        skip + fields.iter().position(|f| *f == name).unwrap_or(0) % (len - skip).max(1)
    };
    match c {
        Corruption::SetField(f, v) => {
            let i = index(f, parts.len()).min(parts.len() - 1);
            parts[i] = v.clone();
        }
        Corruption::SetFieldAhead(f, offset) => {
            let i = index(f, parts.len()).min(parts.len() - 1);
            parts[i] = (now_us + offset).to_string();
        }
        Corruption::DeleteField(f) => {
            let i = index(f, parts.len()).min(parts.len() - 1);
            parts.remove(i);
        }
        Corruption::Retag(tag) => {
            if tagged {
                parts.remove(0);
            }
            if !tag.is_empty() {
                parts.insert(0, tag.to_string());
            }
        }
        _ => return None,
    }
    Some(parts.join(" "))
}

/// The (field, value) pairs of the earlier layout for a string of numbers (its tag left out).
pub fn legacy_pairs(value: &str, fields: &[&str]) -> Vec<(String, String)> {
    let mut parts: Vec<&str> = value.split(' ').collect();
    if parts.len() > 1 && is_tag(parts[0]) {
        parts.remove(0);
    }
    fields
        .iter()
        .zip(parts)
        .map(|(f, v)| (f.to_string(), v.to_string()))
        .collect()
}

/// Offsets from now, in microseconds, for a time written ahead: within the skew a limiter
/// accepts (60 s), at its edge, and beyond.
pub fn ahead_offset() -> impl Strategy<Value = i64> {
    prop_oneof![
        2 => prop::sample::select(vec![
            -1i64, 0, 1, 30_000_000, 59_999_999, 60_000_000, 60_000_001, 3_600_000_000,
        ]),
        1 => 0..120_000_000i64,
    ]
}

/// Tags a value may carry: every kind's, and none.
pub fn tag() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["", "tb", "lb", "fw", "sw", "gcra", "tbx", "zz"])
}

#[derive(Debug, Clone)]
pub struct Step {
    pub dt_us: i64,
    pub args: Vec<String>,
    pub corrupt: Option<Corruption>,
    /// The limiter's field names, in stored order (what `corrupt` refers to).
    pub fields: &'static [&'static str],
}

/// Strings that are not valid arguments, or only just valid.
pub fn junk() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "",
        "abc",
        "-1",
        "0",
        "nan",
        "inf",
        "-inf",
        "1e999",
        "1.5",
        "+3",
        "-0",
        " 1",
        "0x10",
        "1e5",
        ".5",
        "5.",
        "1e-400",
        "99999999999999999999",
        "1000000000000000",
        "1000000000000001",
    ])
    .prop_map(String::from)
}

/// A whole number as text, mostly small.
pub fn count_text() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (0u64..30).prop_map(|n| n.to_string()),
        1 => (0u64..=2_000_000_000_000_000).prop_map(|n| n.to_string()),
        1 => junk(),
    ]
}

/// The words that end a limiter's call: a cost, or now and then `UPTO n` in its place (a partial
/// grant), in either case, with a count that may be out of range, or both (one argument too
/// many).
pub fn cost_words(
    cost: impl Strategy<Value = String> + Clone,
) -> impl Strategy<Value = Vec<String>> {
    let upto = prop_oneof![
        4 => (1u64..40).prop_map(|n| n.to_string()),
        1 => count_text(),
        1 => prop::sample::select(vec!["1000", "1001"]).prop_map(String::from),
    ];
    let keyword = prop::sample::select(vec!["UPTO", "upto", "UpTo"]);
    prop_oneof![
        6 => cost.clone().prop_map(|k| vec![k]),
        3 => (keyword.clone(), upto.clone()).prop_map(|(w, n)| vec![w.to_string(), n]),
        1 => (cost, keyword, upto).prop_map(|(k, w, n)| vec![k, w.to_string(), n]),
    ]
}

/// A positive rate as text, in the forms clients send.
pub fn rate_text() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => Just("5".to_string()),
        1 => Just("0.0166667".to_string()),
        4 => (1u32..1_000_000).prop_map(|n| (f64::from(n) / 1000.0).to_string()),
        2 => (1e-3f64..1e6).prop_map(|f| f.to_string()),
        1 => (1e-12f64..1e16).prop_map(|f| format!("{f:e}")),
        1 => junk(),
    ]
}

/// Time steps between calls, in microseconds.
pub fn time_step() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => Just(0i64),
        2 => Just(1i64),
        5 => 0..300_000i64,
        3 => 0..5_000_000i64,
        1 => Just(86_400_000_000i64),
        1 => -5_000_000..0i64,
        1 => 0..100_000_000_000i64,
    ]
}

/// Values written over a stored field.
pub fn field_garbage() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "abc", "", "-1", "1e999", "nan", "5", "0", "-0", "1.5", "1e300", "9007199254740993",
            "9007199254740994", "1700000000000000", "2e15", " 3", "0x1p3", "-1e15", "-1e308",
            "2.0000000000000002e15", "1700000000000000000", "-1000000000000001",
        ])
        .prop_map(String::from),
        1 => (0u64..2_000_000_000_000_000).prop_map(|n| n.to_string()),
        1 => (0.0f64..1e6).prop_map(|f| f.to_string()),
    ]
}

pub fn corruption(fields: &'static [&'static str]) -> impl Strategy<Value = Corruption> {
    let field = prop::sample::select(fields.to_vec());
    prop_oneof![
        4 => (field.clone(), field_garbage()).prop_map(|(f, v)| Corruption::SetField(f, v)),
        1 => field.clone().prop_map(Corruption::DeleteField),
        2 => Just(Corruption::DeleteKey),
        1 => Just(Corruption::MakeString),
        3 => Just(Corruption::ToLegacyHash),
        1 => Just(Corruption::MakeZset),
        3 => (field, ahead_offset()).prop_map(|(f, o)| Corruption::SetFieldAhead(f, o)),
        3 => tag().prop_map(Corruption::Retag),
        1 => Just(Corruption::ExtraHashField),
    ]
}

/// A sequence of calls: `args` draws each call's arguments; a corruption now and then.
pub fn sequence(
    args: impl Strategy<Value = Vec<String>> + Clone,
    fields: &'static [&'static str],
    len: std::ops::Range<usize>,
) -> impl Strategy<Value = Vec<Step>> {
    let step = (
        time_step(),
        args,
        prop::option::weighted(0.04, corruption(fields)),
    )
        .prop_map(move |(dt_us, args, corrupt)| Step {
            dt_us,
            args,
            corrupt,
            fields,
        });
    prop::collection::vec(step, len)
}

/// Calls `first second [cost]` of one limiter: one shape per sequence (drawn from the two
/// strategies), varying costs, and now and then a call with other or invalid arguments.
fn shaped_sequence<A, B>(
    first: fn() -> A,
    second: fn() -> B,
    fields: &'static [&'static str],
    len: std::ops::Range<usize>,
) -> impl Strategy<Value = Vec<Step>>
where
    A: Strategy<Value = String> + 'static,
    B: Strategy<Value = String> + 'static,
{
    (first(), second()).prop_flat_map(move |(a, b)| {
        let (x, y) = (a.clone(), b.clone());
        let cost = prop_oneof![
            3 => Just("1".to_string()),
            1 => Just("0".to_string()),
            3 => (0u64..25).prop_map(|n| n.to_string()),
            1 => count_text(),
        ];
        let args = prop_oneof![
            8 => cost_words(cost).prop_map(move |k| [vec![x.clone(), y.clone()], k].concat()),
            2 => Just(vec![a, b]),
            1 => (first(), second()).prop_map(|(a, b)| vec![a, b]),
            1 => prop::collection::vec(junk(), 0..5),
        ];
        sequence(args, fields, len.clone())
    })
}

/// `RL.TOKENBUCKET capacity refill_per_sec [cost]`.
pub fn token_bucket_sequence(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Step>> {
    shaped_sequence(count_text, rate_text, &["tokens", "ts"], len)
}

/// One `RL.ALL` call: the number of keys and the words after the keys.
#[derive(Debug, Clone)]
pub struct AllStep {
    pub dt_us: i64,
    pub numkeys: usize,
    /// An `RL.SETTLE` call (its words end with `DELTA n`) rather than an `RL.ALL` one.
    pub settle: bool,
    pub words: Vec<String>,
    /// Corrupts key number `.0` (0-based).
    pub corrupt: Option<(usize, Corruption)>,
}

/// The parameters of one limit of `RL.ALL`, keyword first: every algorithm, mostly with small
/// valid parameters (so that calls are admitted and denied), sometimes with any text.
pub fn all_limit_spec() -> impl Strategy<Value = Vec<String>> {
    let bucket = prop::sample::select(vec![
        "TOKENBUCKET",
        "tokenbucket",
        "LEAKYBUCKET",
        "LeakyBucket",
    ]);
    let window = prop::sample::select(vec![
        "FIXEDWINDOW",
        "SLIDINGWINDOW",
        "slidingwindow",
        "SLIDINGLOG",
        "SlidingLog",
    ]);
    let quarter = |r: u32| (f64::from(r) / 4.0).to_string();
    prop_oneof![
        6 => (bucket.clone(), 1u64..20, 1u32..100).prop_map(move |(k, c, r)| vec![k.to_string(), c.to_string(), quarter(r)]),
        4 => (window.clone(), 1u64..20, 1u32..40).prop_map(move |(k, l, w)| vec![k.to_string(), l.to_string(), quarter(w)]),
        3 => (0u64..10, 1u64..20, 1u32..40).prop_map(move |(b, n, p)| vec!["GCRA".to_string(), b.to_string(), n.to_string(), quarter(p)]),
        3 => (prop::sample::select(vec!["CONCURRENCY", "concurrency"]), 1u64..5, 1u32..40).prop_map(move |(k, l, s)| vec![k.to_string(), l.to_string(), quarter(s)]),
        1 => (count_text(), lease_text()).prop_map(|(l, s)| vec!["CONCURRENCY".to_string(), l, s]),
        1 => (bucket, count_text(), rate_text()).prop_map(|(k, c, r)| vec![k.to_string(), c, r]),
        1 => (window, count_text(), window_text()).prop_map(|(k, l, w)| vec![k.to_string(), l, w]),
        1 => (count_text(), count_text(), rate_text()).prop_map(|(b, n, p)| vec!["gcra".to_string(), b, n, p]),
        1 => prop::collection::vec(junk(), 0..3),
    ]
}

/// Every field name of the algorithms `RL.ALL` combines.
pub const ALL_FIELDS: &[&str] = &[
    "tokens", "ts", "level", "count", "start", "cur", "prev", "tat",
];

/// Sequences of `RL.ALL` calls over up to three keys with fixed shapes, and now and then junk.
pub fn all_sequence(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<AllStep>> {
    (1usize..=3, prop::collection::vec(all_limit_spec(), 3)).prop_flat_map(
        move |(numkeys, specs)| {
            let fixed: Vec<String> = specs.iter().take(numkeys).flatten().cloned().collect();
            let limits_only = fixed.clone();
            let leases = fixed.iter().any(|w| w.eq_ignore_ascii_case("CONCURRENCY"));
            let words = prop_oneof![
                6 => Just(fixed.clone()),
                3 => (0u64..6).prop_map({
                    let fixed = fixed.clone();
                    move |c| {
                        let mut w = fixed.clone();
                        w.extend(["COST".to_string(), c.to_string()]);
                        w
                    }
                }),
                // A partial grant in place of the cost; now and then with a cost too (an error),
                // or a bad count.
                3 => (prop::sample::select(vec!["UPTO", "upto"]), 1u64..30, any::<bool>()).prop_map({
                    let fixed = fixed.clone();
                    move |(k, n, cost)| {
                        let mut w = fixed.clone();
                        if cost && n % 5 == 0 {
                            w.extend(["COST".to_string(), "2".to_string()]);
                        }
                        w.extend([k.to_string(), n.to_string()]);
                        w
                    }
                }),
                1 => (count_text(), prop::sample::select(vec!["1000", "1001", "0"])).prop_map({
                    let fixed = fixed.clone();
                    move |(n, edge)| {
                        let mut w = fixed.clone();
                        w.extend(["UPTO".to_string(), if n.len() % 2 == 0 { n } else { edge.to_string() }]);
                        w
                    }
                }),
                1 => prop::collection::vec(all_limit_spec(), 0..4).prop_map(|s| s.concat()),
            ];
            // The call's lease id, mostly one of a few (renewals), where a limit is a concurrency
            // limit; now and then where none is (an error), or a bad one. Before or after COST.
            let lease = prop::option::weighted(
                if leases { 0.9 } else { 0.03 },
                prop::sample::select(vec!["j1", "j2", "j3", "j4", "j5", ""]),
            );
            let words = (words, lease, any::<bool>()).prop_map(|(mut w, lease, before_cost)| {
                if let Some(id) = lease {
                    let pair = ["LEASE".to_string(), id.to_string()];
                    let n = w.len();
                    if before_cost
                        && n >= 2
                        && (w[n - 2].eq_ignore_ascii_case("COST")
                            || w[n - 2].eq_ignore_ascii_case("UPTO"))
                    {
                        w.splice(n - 2..n - 2, pair);
                    } else {
                        w.extend(pair);
                    }
                }
                w
            });
            // Now and then a settlement of the same limits: refunds, charges (debts), reports,
            // and bad deltas.
            let delta = prop_oneof![
                8 => (-40i64..40).prop_map(|d| d.to_string()),
                1 => (-1_000_000_000_000_000i64..=1_000_000_000_000_000).prop_map(|d| d.to_string()),
                1 => prop::sample::select(vec!["1000000000000001", "-0", "+3", "1.5"]).prop_map(String::from),
                1 => junk(),
            ];
            let settle = delta.prop_map(move |d| {
                let mut w = limits_only.clone();
                w.extend(["DELTA".to_string(), d]);
                w
            });
            let call = prop_oneof![
                3 => words.prop_map(|w| (false, w)),
                1 => settle.prop_map(|w| (true, w)),
            ];
            let corrupt = prop::option::weighted(0.04, (0..numkeys, corruption(ALL_FIELDS)));
            let step = (time_step(), call, corrupt).prop_map(
                move |(dt_us, (settle, words), corrupt)| AllStep {
                    dt_us,
                    numkeys,
                    settle,
                    words,
                    corrupt,
                },
            );
            prop::collection::vec(step, len.clone())
        },
    )
}

/// `RL.LEAKYBUCKET capacity leak_per_sec [cost]`.
pub fn leaky_bucket_sequence(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Step>> {
    shaped_sequence(count_text, rate_text, &["level", "ts"], len)
}

/// A window length in seconds as text: mostly comparable to the time steps (so windows open,
/// end and roll over), with millisecond rounding edges, extremes and junk.
pub fn window_text() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => prop::sample::select(vec![
            "1", "10", "60", "0.001", "0.0005", "0.0004", "0.0015", "1.2345", "86400", "1e10",
            "10000000000.1", "2.5e-1",
        ])
        .prop_map(String::from),
        4 => (1u32..10_000).prop_map(|n| (f64::from(n) / 1000.0).to_string()),
        2 => (1e-4f64..20.0).prop_map(|f| f.to_string()),
        1 => (1e-5f64..1e11).prop_map(|f| format!("{f:e}")),
        1 => junk(),
    ]
}

pub fn fixed_window_sequence(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Step>> {
    shaped_sequence(count_text, window_text, &["count", "start"], len)
}

pub fn sliding_window_sequence(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Step>> {
    shaped_sequence(count_text, window_text, &["start", "cur", "prev"], len)
}

/// Arguments for `RL.GCRA`: one shape per sequence (max_burst, count_per_period, period_sec),
/// varying costs, and now and then a call with other or invalid arguments.
pub fn gcra_args() -> impl Strategy<Value = (String, String, String)> {
    let period = prop_oneof![
        3 => prop::sample::select(vec!["1", "60", "0.5", "3600", "0.001"]).prop_map(String::from),
        2 => rate_text(),
    ];
    (count_text(), count_text(), period)
}

pub fn gcra_sequence(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Step>> {
    gcra_args().prop_flat_map(move |(burst, count, period)| {
        let (b, c, p) = (burst.clone(), count.clone(), period.clone());
        let cost = prop_oneof![
            3 => Just("1".to_string()),
            1 => Just("0".to_string()),
            3 => (0u64..25).prop_map(|n| n.to_string()),
            1 => count_text(),
        ];
        let args = prop_oneof![
            8 => cost_words(cost)
                .prop_map(move |k| [vec![b.clone(), c.clone(), p.clone()], k].concat()),
            2 => Just(vec![burst, count, period]),
            1 => (count_text(), count_text(), rate_text()).prop_map(|(b, c, p)| vec![b, c, p]),
            1 => prop::collection::vec(junk(), 0..6),
        ];
        sequence(args, &["tat"], len.clone())
    })
}

/// Values written over a `CL.THROTTLE` key: nanosecond times around the differential suites'
/// clock (1.7e18 ns), limits of the stored range, and text that is not a time.
pub fn ns_garbage() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => (1_699_999_000_000_000_000u64..1_700_001_000_000_000_000).prop_map(|n| n.to_string()),
        1 => (0u64..u64::MAX).prop_map(|n| n.to_string()),
        2 => prop::sample::select(vec![
            "0", "00017", "", "abc", "-1", "+5", "1.5", "1e18", " 1", "9199999999999999999",
            "9200000000000000000", "18446744073709551616", "1700000000000000000",
            "000000000001700000000000000000", "gcra 1700000000000000", "tb 5 1700000000000000",
            "gcra", "1700000000000000", "3399999999999999", "3400000000000000",
            "3400000000000001",
        ])
        .prop_map(String::from),
    ]
}

/// Something done to a string-backed limiter's key: `SetField` sets the value (no expiry),
/// `SetFieldAhead` sets it to a time ahead of now (in nanoseconds), `MakeString` replaces it
/// with a hash (the wrong type for it), the rest delete it.
pub fn string_corruption() -> impl Strategy<Value = Corruption> {
    prop_oneof![
        4 => ns_garbage().prop_map(|v| Corruption::SetField("value", v)),
        2 => Just(Corruption::DeleteKey),
        1 => Just(Corruption::MakeString),
        2 => prop_oneof![
            ahead_offset(),
            1_000_000_000i64..3_000_000_000_000,
        ]
        .prop_map(|o| Corruption::SetFieldAhead("value", o)),
    ]
}

/// Arguments for `CL.THROTTLE`: one shape per sequence (max_burst, count_per_period, period),
/// varying quantities, and now and then a call with other or invalid arguments.
pub fn throttle_args() -> impl Strategy<Value = (String, String, String)> {
    let period = prop_oneof![
        3 => prop::sample::select(vec!["1", "60", "3600", "86400", "2"]).prop_map(String::from),
        1 => count_text(),
    ];
    let pick = |v: Vec<&'static str>| prop::sample::select(v).prop_map(String::from);
    // Large limits with intervals that are not whole seconds: quantities above 1e6 and
    // tolerances up to the 1e18 ns bound, where the Lua twin's exact products matter.
    let large = (
        pick(vec!["999999", "1000000", "123456789", "999999999999", "31"]),
        pick(vec!["1", "3", "7", "999", "1000", "333333", "1000000"]),
        pick(vec!["1", "7", "1001", "86400", "31536000", "999999937"]),
    );
    prop_oneof![
        3 => (count_text(), count_text(), period),
        1 => large,
    ]
}

pub fn throttle_sequence(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Step>> {
    throttle_args().prop_flat_map(move |(burst, count, period)| {
        let (b, c, p) = (burst.clone(), count.clone(), period.clone());
        let quantity = prop_oneof![
            3 => Just("1".to_string()),
            1 => Just("0".to_string()),
            3 => (0u64..25).prop_map(|n| n.to_string()),
            1 => count_text(),
            1 => prop::sample::select(vec!["1000001", "123456788", "999999", "2000000", "999999999999"])
                .prop_map(String::from),
        ];
        let args = prop_oneof![
            8 => quantity.prop_map(move |q| vec![b.clone(), c.clone(), p.clone(), q]),
            2 => Just(vec![burst, count, period]),
            1 => (count_text(), count_text(), count_text()).prop_map(|(b, c, p)| vec![b, c, p]),
            1 => prop::collection::vec(junk(), 0..6),
        ];
        let step = (
            time_step(),
            args,
            prop::option::weighted(0.04, string_corruption()),
        )
            .prop_map(|(dt_us, args, corrupt)| Step {
                dt_us,
                args,
                corrupt,
                fields: &["value"],
            });
        prop::collection::vec(step, len.clone())
    })
}

/// Something done to a sliding log's sorted set between two calls, identically on both paths.
#[derive(Debug, Clone)]
pub enum LogCorruption {
    /// `ZADD key score member` with arbitrary text (Redis refuses only NaN).
    AddRaw(&'static str, &'static str),
    /// A well-formed entry `<now + offset>:<index>` at score `now + offset`.
    AddAt(i64, u32),
    /// `ZPOPMIN key`.
    PopOldest,
    /// `ZPOPMAX key`.
    PopNewest,
    DeleteKey,
    MakeString,
    /// `PERSIST key`: a set without an expiry, which no limiter writes.
    Persist,
    /// This many entries that left the window long ago (`<t>:<i>` at scores before the call's
    /// window, as a log that nothing trimmed for a while holds); on a lease set, long expired
    /// leases.
    AddOld(u32),
}

#[derive(Debug, Clone)]
pub struct LogStep {
    pub dt_us: i64,
    pub args: Vec<String>,
    pub corrupt: Option<LogCorruption>,
}

pub fn log_corruption() -> impl Strategy<Value = LogCorruption> {
    let score = prop::sample::select(vec![
        "inf",
        "-inf",
        "-5",
        "-0",
        "0",
        "1.5",
        "100000000000000000",
        "9007199254740992",
        "9007199254740994",
        "1700000000000000",
    ]);
    let member = prop::sample::select(vec![
        "x",
        "",
        "0:0",
        "-0:0",
        "00:1",
        "1.5:0",
        "9007199254740992:0",
        "9007199254740993:0",
        "1700000000000000:0",
        "1700000000000000:x",
        "job-7",
    ]);
    let offset = prop_oneof![
        6 => -20_000_000i64..2_000_000,
        1 => ahead_offset(),
        1 => prop::sample::select(vec![
            10_000_060_000_000i64, 10_000_060_000_001, 10_000_000_000_000,
        ]),
    ];
    prop_oneof![
        3 => (score, member).prop_map(|(s, m)| LogCorruption::AddRaw(s, m)),
        6 => (offset, 0u32..4).prop_map(|(o, i)| LogCorruption::AddAt(o, i)),
        2 => Just(LogCorruption::PopOldest),
        2 => Just(LogCorruption::PopNewest),
        4 => Just(LogCorruption::DeleteKey),
        1 => Just(LogCorruption::MakeString),
        1 => Just(LogCorruption::Persist),
        2 => prop_oneof![1u32..10, 120u32..300].prop_map(LogCorruption::AddOld),
    ]
}

/// Arguments for `RL.SLIDINGLOG`: one log shape per sequence, varying costs, now and then other
/// or invalid arguments, and sometimes a large limit (ZADD in several batches).
pub fn sliding_log_sequence(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<LogStep>> {
    let limit = prop_oneof![
        16 => (1u64..30).prop_map(|n| n.to_string()),
        4 => count_text(),
        1 => (400u64..800).prop_map(|n| n.to_string()),
        1 => prop::sample::select(vec!["10000", "10001"]).prop_map(String::from),
    ];
    (limit, window_text()).prop_flat_map(move |(limit, window)| {
        let (l, w) = (limit.clone(), window.clone());
        let big: u64 = limit.parse().unwrap_or(30).clamp(1, 800);
        let cost = prop_oneof![
            3 => Just("1".to_string()),
            1 => Just("0".to_string()),
            3 => (0u64..25).prop_map(|n| n.to_string()),
            1 => (0..=big).prop_map(|n| n.to_string()),
            1 => count_text(),
        ];
        let args = prop_oneof![
            8 => cost_words(cost).prop_map(move |k| [vec![l.clone(), w.clone()], k].concat()),
            2 => Just(vec![limit, window]),
            1 => (count_text(), window_text()).prop_map(|(l, w)| vec![l, w]),
            1 => prop::collection::vec(junk(), 0..5),
        ];
        let step = (
            time_step(),
            args,
            prop::option::weighted(0.04, log_corruption()),
        )
            .prop_map(|(dt_us, args, corrupt)| LogStep {
                dt_us,
                args,
                corrupt,
            });
        prop::collection::vec(step, len.clone())
    })
}

/// `RL.SLIDINGLOG` on logs of up to 10,000 entries (the largest limit): opening calls that fill 9,700 or more at
/// one instant, 1,000 (the most one call adds) at a time, then up to the limit and past it,
/// then calls of up to 1,000, small calls
/// and peeks between them, time steps that take thousands of entries out of the window (so that
/// writes trim as many as they add), and now and then a corruption.
pub fn large_log_sequence(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<LogStep>> {
    let limit = prop::sample::select(vec!["10000", "9990"]);
    let window = prop::sample::select(vec!["3600", "600", "20"]);
    (limit, window, 9_700u64..=10_000).prop_flat_map(move |(limit, window, first)| {
        let cost = prop_oneof![
            3 => 500u64..=1_000,
            2 => 0u64..4,
            1 => Just(1_000u64),
            1 => 50u64..200,
        ];
        let step_in_time = prop_oneof![
            6 => time_step(),
            1 => 1_000_000..30_000_000i64,
        ];
        let args = move |cost: u64| vec![limit.to_string(), window.to_string(), cost.to_string()];
        let step = (
            step_in_time,
            cost,
            prop::option::weighted(0.05, log_corruption()),
        )
            .prop_map(move |(dt_us, cost, corrupt)| LogStep {
                dt_us,
                args: args(cost),
                corrupt,
            });
        // Filled to `first`, then to the limit and one call past it: denied, whatever the limit.
        let mut opening: Vec<LogStep> = (0..first.div_ceil(1_000))
            .map(|i| LogStep {
                dt_us: 0,
                args: args((first - i * 1_000).min(1_000)),
                corrupt: None,
            })
            .collect();
        opening.extend((0..(10_000 - first).div_ceil(1_000) + 1).map(|_| LogStep {
            dt_us: 0,
            args: args(1_000),
            corrupt: None,
        }));
        prop::collection::vec(step, len.clone()).prop_map(move |rest| {
            let mut steps = opening.clone();
            steps.extend(rest);
            steps
        })
    })
}

/// One call on a key of concurrency leases: `RL.ACQUIRE key args...` or `RL.RELEASE key args...`.
#[derive(Debug, Clone)]
pub struct LeaseStep {
    pub dt_us: i64,
    pub release: bool,
    pub args: Vec<String>,
    pub corrupt: Option<LogCorruption>,
}

/// A lease length in seconds as text: mostly comparable to the time steps (so leases expire
/// between calls, and at the very microsecond of a call), with rounding edges and junk.
fn lease_text() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => prop::sample::select(vec![
            "1", "0.001", "0.0005", "0.0004", "0.0015", "2.5e-1", "10", "10000000", "10000000.001",
        ])
        .prop_map(String::from),
        4 => (1u32..5_000).prop_map(|n| (f64::from(n) / 1000.0).to_string()),
        2 => (1e-4f64..20.0).prop_map(|f| f.to_string()),
        1 => junk(),
    ]
}

/// `RL.ACQUIRE` and `RL.RELEASE` on one key: one limit and lease length per sequence (sometimes
/// another), a few lease ids that come back (renewals, releases of held, expired and unknown
/// leases), ids of bad lengths, junk, and now and then a corruption (including other holders'
/// well-formed leases).
pub fn lease_sequence(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<LeaseStep>> {
    let limit = prop_oneof![
        12 => (1u64..6).prop_map(|n| n.to_string()),
        2 => count_text(),
        1 => prop::sample::select(vec!["10000", "10001", "0"]).prop_map(String::from),
    ];
    (limit, lease_text()).prop_flat_map(move |(limit, lease)| {
        let id = prop_oneof![
            12 => prop::sample::select(vec!["a", "b", "c", "d", "e", "f", "g"]).prop_map(String::from),
            1 => prop::sample::select(vec![0usize, 128, 129]).prop_map(|n| "x".repeat(n)),
            1 => Just("1700000000000000:0".to_string()),
        ];
        let (l, w) = (limit.clone(), lease.clone());
        let call = prop_oneof![
            10 => id.clone().prop_map(move |id| (false, vec![l.clone(), w.clone(), id])),
            1 => (count_text(), lease_text(), id.clone()).prop_map(|(l, w, id)| (false, vec![l, w, id])),
            5 => id.prop_map(|id| (true, vec![id])),
            1 => prop::collection::vec(junk(), 0..5).prop_map(|j| (false, j)),
            1 => prop::collection::vec(junk(), 0..3).prop_map(|j| (true, j)),
        ];
        let step = (
            time_step(),
            call,
            prop::option::weighted(0.04, log_corruption()),
        )
            .prop_map(|(dt_us, (release, args), corrupt)| LeaseStep {
                dt_us,
                release,
                args,
                corrupt,
            });
        prop::collection::vec(step, len.clone())
    })
}
