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
            8 => cost.prop_map(move |k| vec![b.clone(), c.clone(), p.clone(), k]),
            2 => Just(vec![burst, count, period]),
            1 => (count_text(), count_text(), rate_text()).prop_map(|(b, c, p)| vec![b, c, p]),
            1 => prop::collection::vec(junk(), 0..6),
        ];
        sequence(args, &["tat"], len.clone())
    })
}
