//! The service's metrics in the Prometheus text format, under the names and labels that
//! envoyproxy/ratelimit's Prometheus mapping gives its stats, so that dashboards carry over.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

/// The per-descriptor counters, in the order of [`PER_LIMIT`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LimitCounts {
    pub total_hits: u64,
    pub over_limit: u64,
    pub near_limit: u64,
    pub within_limit: u64,
    pub shadow_mode: u64,
}

const PER_LIMIT: [&str; 5] = [
    "total_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
];

/// Upper bounds of the response time histogram, in seconds.
const BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Debug, Default)]
struct Inner {
    limits: BTreeMap<String, LimitCounts>,
    config_load_success: u64,
    config_load_error: u64,
    total_requests: u64,
    errors: BTreeMap<String, u64>,
    buckets: [u64; BUCKETS.len()],
    time_sum: f64,
    time_count: u64,
}

#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

/// The labels of a stat key (`domain.key_value.key`): `domain`, `key1`, and `key2` when there
/// is a third part, after the stat name's own clean-up (`:` and `|` to `_`, the dots of an
/// IPv4 address to `_`), as the anchor's mapping reads them.
pub fn labels(stats_key: &str) -> Vec<(&'static str, String)> {
    let clean = sanitize(stats_key);
    let mut parts = clean.split('.');
    let mut out = Vec::new();
    for name in ["domain", "key1", "key2"] {
        match parts.next() {
            Some(p) => out.push((name, p.to_string())),
            None => break,
        }
    }
    out
}

fn sanitize(s: &str) -> String {
    let s: String = s
        .chars()
        .map(|c| if c == ':' || c == '|' { '_' } else { c })
        .collect();
    // d.d.d.d, 1 to 3 digits each: its dots become underscores.
    let b = s.as_bytes();
    let mut out = b.to_vec();
    let mut i = 0;
    while i < b.len() {
        if let Some(end) = ipv4_at(b, i) {
            for c in &mut out[i..end] {
                if *c == b'.' {
                    *c = b'_';
                }
            }
            i = end;
        } else {
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or(s)
}

/// The end of a `\d{1,3}(\.\d{1,3}){3}` starting at `i`.
fn ipv4_at(b: &[u8], mut i: usize) -> Option<usize> {
    for group in 0..4 {
        if group > 0 {
            if b.get(i) != Some(&b'.') {
                return None;
            }
            i += 1;
        }
        let start = i;
        while i < b.len() && i - start < 3 && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return None;
        }
    }
    Some(i)
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds to the counters of one stat key.
    pub fn add(&self, stats_key: &str, f: impl FnOnce(&mut LimitCounts)) {
        let mut m = self.lock();
        if let Some(c) = m.limits.get_mut(stats_key) {
            f(c);
        } else {
            let mut c = LimitCounts::default();
            f(&mut c);
            m.limits.insert(stats_key.to_string(), c);
        }
    }

    pub fn counts(&self, stats_key: &str) -> LimitCounts {
        self.lock()
            .limits
            .get(stats_key)
            .copied()
            .unwrap_or_default()
    }

    pub fn config_loaded(&self, ok: bool) {
        let mut m = self.lock();
        if ok {
            m.config_load_success += 1;
        } else {
            m.config_load_error += 1;
        }
    }

    /// (successes, errors) of configuration loads.
    pub fn config_loads(&self) -> (u64, u64) {
        let m = self.lock();
        (m.config_load_success, m.config_load_error)
    }

    /// One `ShouldRateLimit` call and how long it took.
    pub fn request(&self, took: Duration) {
        let mut m = self.lock();
        m.total_requests += 1;
        let s = took.as_secs_f64();
        for (i, b) in BUCKETS.iter().enumerate() {
            if s <= *b {
                m.buckets[i] += 1;
            }
        }
        m.time_sum += s;
        m.time_count += 1;
    }

    /// A call that failed (`redis_error`, `service_error`).
    pub fn error(&self, kind: &str) {
        *self.lock().errors.entry(kind.to_string()).or_default() += 1;
    }

    pub fn render(&self) -> String {
        let m = self.lock();
        let mut out = String::new();
        for (i, name) in PER_LIMIT.iter().enumerate() {
            let _ = writeln!(out, "# TYPE ratelimit_service_rate_limit_{name} counter");
            for (key, c) in &m.limits {
                let v = [
                    c.total_hits,
                    c.over_limit,
                    c.near_limit,
                    c.within_limit,
                    c.shadow_mode,
                ][i];
                let labels: Vec<String> = labels(key)
                    .iter()
                    .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                    .collect();
                let _ = writeln!(
                    out,
                    "ratelimit_service_rate_limit_{name}{{{}}} {v}",
                    labels.join(",")
                );
            }
        }
        let _ = writeln!(out, "# TYPE ratelimit_service_config_load_success counter");
        let _ = writeln!(
            out,
            "ratelimit_service_config_load_success {}",
            m.config_load_success
        );
        let _ = writeln!(out, "# TYPE ratelimit_service_config_load_error counter");
        let _ = writeln!(
            out,
            "ratelimit_service_config_load_error {}",
            m.config_load_error
        );
        let _ = writeln!(out, "# TYPE ratelimit_service_total_requests counter");
        let _ = writeln!(
            out,
            "ratelimit_service_total_requests{{grpc_method=\"ShouldRateLimit\"}} {}",
            m.total_requests
        );
        let _ = writeln!(
            out,
            "# TYPE ratelimit_service_should_rate_limit_error counter"
        );
        for (kind, n) in &m.errors {
            let _ = writeln!(
                out,
                "ratelimit_service_should_rate_limit_error{{err_type=\"{}\"}} {n}",
                escape(kind)
            );
        }
        let _ = writeln!(
            out,
            "# TYPE ratelimit_service_response_time_seconds histogram"
        );
        for (i, b) in BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "ratelimit_service_response_time_seconds_bucket{{grpc_method=\"ShouldRateLimit\",le=\"{b}\"}} {}",
                m.buckets[i]
            );
        }
        let _ = writeln!(
            out,
            "ratelimit_service_response_time_seconds_bucket{{grpc_method=\"ShouldRateLimit\",le=\"+Inf\"}} {}",
            m.time_count
        );
        let _ = writeln!(
            out,
            "ratelimit_service_response_time_seconds_sum{{grpc_method=\"ShouldRateLimit\"}} {}",
            m.time_sum
        );
        let _ = writeln!(
            out,
            "ratelimit_service_response_time_seconds_count{{grpc_method=\"ShouldRateLimit\"}} {}",
            m.time_count
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_follow_the_anchor_mapping() {
        // stat key, then the labels it gets
        let rows: &[(&str, &[(&str, &str)])] = &[
            ("web", &[("domain", "web")]),
            ("web.path", &[("domain", "web"), ("key1", "path")]),
            (
                "web.remote_address_10.1.2.3",
                &[("domain", "web"), ("key1", "remote_address_10_1_2_3")],
            ),
            (
                "web.a_b.c.d",
                &[("domain", "web"), ("key1", "a_b"), ("key2", "c")],
            ),
            ("web.h:x|y", &[("domain", "web"), ("key1", "h_x_y")]),
        ];
        for (key, want) in rows {
            let got = labels(key);
            let want: Vec<(&str, String)> = want.iter().map(|(k, v)| (*k, v.to_string())).collect();
            assert_eq!(got, want, "{key}");
        }
    }
}
