//! Generated call sequences for the differential suites: arguments (valid and not), time steps
//! (zero, one microsecond, seconds, days, backwards) and corruptions of the stored state.
#![allow(dead_code)]

use proptest::prelude::*;

/// Something done to the stored key between two calls, identically on both paths.
#[derive(Debug, Clone)]
pub enum Corruption {
    SetField(&'static str, String),
    DeleteField(&'static str),
    DeleteKey,
    MakeString,
}

#[derive(Debug, Clone)]
pub struct Step {
    pub dt_us: i64,
    pub args: Vec<String>,
    pub corrupt: Option<Corruption>,
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
            "9007199254740994", "1700000000000000", "2e15", " 3", "0x1p3",
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
        1 => field.prop_map(Corruption::DeleteField),
        2 => Just(Corruption::DeleteKey),
        1 => Just(Corruption::MakeString),
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
        .prop_map(|(dt_us, args, corrupt)| Step {
            dt_us,
            args,
            corrupt,
        });
    prop::collection::vec(step, len)
}

/// Arguments for `RL.TOKENBUCKET`: one bucket shape per sequence, varying costs, and now and
/// then a call with other or invalid arguments.
pub fn token_bucket_args() -> impl Strategy<Value = (String, String)> {
    (count_text(), rate_text())
}

pub fn token_bucket_sequence(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Step>> {
    token_bucket_args().prop_flat_map(move |(capacity, rate)| {
        let (c, r) = (capacity.clone(), rate.clone());
        let cost = prop_oneof![
            3 => Just("1".to_string()),
            1 => Just("0".to_string()),
            3 => (0u64..25).prop_map(|n| n.to_string()),
            1 => count_text(),
        ];
        let args = prop_oneof![
            8 => cost.prop_map(move |k| vec![c.clone(), r.clone(), k]),
            2 => Just(vec![capacity, rate]),
            1 => (count_text(), rate_text()).prop_map(|(c, r)| vec![c, r]),
            1 => prop::collection::vec(junk(), 0..5),
        ];
        sequence(args, &["tokens", "ts"], len.clone())
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
    ]);
    prop_oneof![
        3 => (score, member).prop_map(|(s, m)| LogCorruption::AddRaw(s, m)),
        6 => (-20_000_000i64..2_000_000, 0u32..4).prop_map(|(o, i)| LogCorruption::AddAt(o, i)),
        2 => Just(LogCorruption::PopOldest),
        2 => Just(LogCorruption::PopNewest),
        4 => Just(LogCorruption::DeleteKey),
        1 => Just(LogCorruption::MakeString),
    ]
}

/// `window_sec` as text: mostly windows comparable to the generated time steps.
pub fn window_text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "0.001", "0.01", "0.25", "1", "2.5", "10", "60", "86400", "1e10", "0.0004",
            "0.0005", "10000000000.001", "1e-3",
        ])
        .prop_map(String::from),
        8 => (1u32..20_000).prop_map(|n| (f64::from(n) / 1000.0).to_string()),
        1 => junk(),
    ]
}

/// Arguments for `RL.SLIDINGLOG`: one log shape per sequence, varying costs, now and then other
/// or invalid arguments, and sometimes a large limit (ZADD in several batches).
pub fn sliding_log_sequence(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<LogStep>> {
    let limit = prop_oneof![
        16 => (1u64..30).prop_map(|n| n.to_string()),
        4 => count_text(),
        1 => (400u64..800).prop_map(|n| n.to_string()),
        1 => prop::sample::select(vec!["100000", "100001"]).prop_map(String::from),
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
            8 => cost.prop_map(move |k| vec![l.clone(), w.clone(), k]),
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
