//! How the server under test turns a Lua number passed to `redis.call` into a string: C's
//! `%.17g` on Redis 7.0, the shortest round-trip digits on Redis 7.2+ and Valkey. The twins no
//! longer depend on it (they format every number they store themselves), but the embedded-Lua
//! differential suite runs its shim in both forms, so the model of each form is checked here
//! against the real server, value by value, with `ECHO` (which writes nothing): `%.17g` exactly;
//! the shortest form exactly for integers and for its layout, and in its digits wherever the
//! servers' Grisu2 finds the shortest (all but a few doubles in a thousand).

mod harness;

use harness::memory::{NumberForm, decimal_parts, fpconv_layout};
use harness::{Server, server_identity};
use redis::Connection;

/// What the server replies for `redis.call('ECHO', tonumber(v))` of each value.
fn server_texts(c: &mut Connection, values: &[f64]) -> Vec<String> {
    let script = "local out = {} for i, v in ipairs(ARGV) do \
                  out[i] = redis.call('ECHO', tonumber(v)) end return out";
    let mut out = Vec::new();
    for chunk in values.chunks(500) {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(script).arg(0);
        for v in chunk {
            // %.17g reads back as the same double (Lua's tonumber is strtod).
            cmd.arg(format!("{v:e}"));
        }
        let texts: Vec<String> = cmd.query(c).expect("EVAL ECHO");
        out.extend(texts);
    }
    out
}

/// Values where the two forms and their layouts differ: ties, tiny and huge magnitudes,
/// negative zero, integers around and above 2^53 and 2^62, and pseudo-random doubles of every
/// exponent.
fn values() -> Vec<f64> {
    let mut v = vec![
        0.1 + 0.2,
        1.0 / 3.0,
        5.719_964_989_931_1,
        1e-7,
        1e21,
        -0.0,
        0.0,
        99.999_999_999_999_99,
        123_456_789_012_345_678.0,
        9_007_199_254_740_993.0,
        1_700_000_000_123_456.5,
        4_611_686_018_427_387_904.0,
        -4_611_686_018_427_387_904.0,
        9_223_372_036_854_775_808.0,
        f64::MIN_POSITIVE,
        5e-324,
        f64::MAX,
        -f64::MAX,
        1e-5,
        1e-6,
        0.000_123,
        1e15,
        1e16,
        1e17,
        1.5e17,
        1e22,
        2.5,
        0.5,
        -1.25e-10,
    ];
    for e in -30..=30 {
        v.push(10f64.powi(e));
        v.push(1.5 * 10f64.powi(e));
        v.push(-7.25 * 10f64.powi(e));
    }
    // Decimal fractions k / 10^n: the kind of numbers the limiters compute.
    for k in 1..200u32 {
        for n in [1, 3, 6, 9] {
            v.push(f64::from(k) * 0.37 / 10f64.powi(n));
        }
    }
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    while v.len() < 6_000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let x = f64::from_bits(state);
        if x.is_finite() {
            v.push(x);
        }
    }
    v
}

#[test]
fn each_server_converts_lua_numbers_as_its_model_says() {
    let s = Server::start();
    let mut c = s.connect();
    let (name, version) = server_identity(&mut c);
    let third = server_texts(&mut c, &[1.0 / 3.0]);
    let form = match third[0].as_str() {
        "0.33333333333333331" => NumberForm::G17,
        "0.3333333333333333" => NumberForm::Shortest,
        other => panic!("{name} {version}: unknown number form, 1/3 -> {other}"),
    };
    let expected = if name == "redis" && version.starts_with("7.0.") {
        NumberForm::G17
    } else {
        NumberForm::Shortest
    };
    assert_eq!(form, expected, "{name} {version}");

    let values = values();
    let texts = server_texts(&mut c, &values);
    assert_eq!(texts.len(), values.len());
    let mut other_digits = Vec::new();
    for (v, text) in values.iter().zip(&texts) {
        let ours = form.text(*v);
        if *text == ours {
            continue;
        }
        // Only the shortest form may differ, and only in its digits: Redis and Valkey use Grisu2,
        // which for a few doubles gives more digits than the shortest that read back the same,
        // or as many but not the closest.
        assert_eq!(form, NumberForm::Shortest, "{v:e}: {text} against {ours}");
        assert!(
            *v != v.trunc() || v.abs() > 4.6e18,
            "{v:e}: integers below 2^62 are exact: {text} against {ours}"
        );
        assert_eq!(
            text.parse::<f64>().ok(),
            Some(*v),
            "{text} reads back as {v:e}"
        );
        let (negative, digits, k) = decimal_parts(text);
        assert_eq!(
            &fpconv_layout(negative, &digits, k),
            text,
            "the layout of {text}"
        );
        assert!(
            decimal_parts(&ours).1.len() <= digits.len(),
            "{ours} is no longer than {text}"
        );
        other_digits.push((*v, text.clone(), ours));
    }
    println!(
        "{name} {version}: {form:?}; of {} values, {} have other digits than the shortest \
         (Grisu2), the same layout: {:?}",
        values.len(),
        other_digits.len(),
        &other_digits[..other_digits.len().min(4)]
    );
    // Grisu2 is the shortest for all but a small fraction of doubles.
    assert!(other_digits.len() * 200 < values.len(), "{other_digits:?}");
}
