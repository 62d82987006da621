//! Counters of decisions per limit, in Prometheus text format.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::types::LocalAnswer;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub allowed: u64,
    pub denied: u64,
    pub degraded: u64,
    /// Requests a shadow limit would have refused (and let through).
    pub shadow_denied: u64,
    /// Whether the limit has been evaluated as a shadow limit.
    pub shadow: bool,
    /// Units given back by settlements (an actual cost below the estimate).
    pub refunded: u64,
    /// Units taken by settlements (an actual cost above the estimate).
    pub charged: u64,
    /// Admissions answered from a leased batch, without a call to Redis (among `allowed`).
    pub batch: u64,
    /// Denials answered by the deny cache, without a call to Redis (among `denied`, or
    /// `shadow_denied` for a shadow limit).
    pub deny_cache: u64,
}

impl Counts {
    /// `other`'s counts added to these.
    fn add(&mut self, other: &Counts) {
        self.allowed += other.allowed;
        self.denied += other.denied;
        self.degraded += other.degraded;
        self.shadow_denied += other.shadow_denied;
        self.shadow |= other.shadow;
        self.refunded = self.refunded.saturating_add(other.refunded);
        self.charged = self.charged.saturating_add(other.charged);
        self.batch += other.batch;
        self.deny_cache += other.deny_cache;
    }
}

/// Shards of the counts: each thread counts in its own (threads take them in turn), so that the
/// decisions of a multi-threaded server do not all wait on one lock; reading adds them up.
const SHARDS: usize = 16;

/// The shard of the calling thread.
fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    INDEX.with(|i| *i)
}

#[derive(Debug)]
pub struct Metrics {
    shards: [Mutex<BTreeMap<String, Counts>>; SHARDS],
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            shards: std::array::from_fn(|_| Mutex::default()),
        }
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    /// Every limit's counts, the shards added up.
    fn merged(&self) -> BTreeMap<String, Counts> {
        let mut all: BTreeMap<String, Counts> = BTreeMap::new();
        for shard in &self.shards {
            let m = shard.lock().unwrap_or_else(|e| e.into_inner());
            for (name, c) in m.iter() {
                match all.get_mut(name) {
                    Some(sum) => sum.add(c),
                    None => {
                        all.insert(name.clone(), *c);
                    }
                }
            }
        }
        all
    }

    /// Applies `f` to the counts of `limit` in this thread's shard, made on first use (its name
    /// copied only then).
    fn update(&self, limit: &str, f: impl FnOnce(&mut Counts)) {
        let mut m = self.shards[shard_index()]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(c) = m.get_mut(limit) {
            f(c);
        } else {
            let mut c = Counts::default();
            f(&mut c);
            m.insert(limit.to_string(), c);
        }
    }

    pub fn record(&self, limit: &str, allowed: bool, degraded: bool) {
        self.record_answer(limit, allowed, degraded, None);
    }

    /// [`Metrics::record`] and [`Metrics::record_local`] at once.
    pub(crate) fn record_answer(
        &self,
        limit: &str,
        allowed: bool,
        degraded: bool,
        local: Option<LocalAnswer>,
    ) {
        self.update(limit, |c| {
            if allowed {
                c.allowed += 1;
            } else {
                c.denied += 1;
            }
            if degraded {
                c.degraded += 1;
            }
            match local {
                Some(LocalAnswer::Batch) => c.batch += 1,
                Some(LocalAnswer::DenyCache) => c.deny_cache += 1,
                None => {}
            }
        });
    }

    /// A shadow limit's answer: `allowed` counts as allowed, a denial as `shadow_denied` (the
    /// request went through), never as `denied`.
    pub fn record_shadow(&self, limit: &str, allowed: bool, degraded: bool) {
        self.update(limit, |c| {
            c.shadow = true;
            if allowed {
                c.allowed += 1;
            } else {
                c.shadow_denied += 1;
            }
            if degraded {
                c.degraded += 1;
            }
        });
    }

    /// An answer made in the process for `limit` (counted besides `allowed` or `denied`).
    pub fn record_local(&self, limit: &str, answer: LocalAnswer) {
        self.update(limit, |c| match answer {
            LocalAnswer::Batch => c.batch += 1,
            LocalAnswer::DenyCache => c.deny_cache += 1,
        });
    }

    /// A settlement of `delta` units on `limit`: below 0 refunded, above 0 charged.
    pub fn record_settled(&self, limit: &str, delta: i64) {
        self.update(limit, |c| {
            if delta < 0 {
                c.refunded = c.refunded.saturating_add(delta.unsigned_abs());
            } else {
                c.charged = c.charged.saturating_add(delta.unsigned_abs());
            }
        });
    }

    pub fn counts(&self, limit: &str) -> Counts {
        let mut sum = Counts::default();
        for shard in &self.shards {
            let m = shard.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(c) = m.get(limit) {
                sum.add(c);
            }
        }
        sum
    }

    /// `ratelimit_decisions_total{limit="...",outcome="allowed|denied|degraded"}`, and for a
    /// limit evaluated as a shadow limit also `outcome="shadow_denied"` (requests it would have
    /// refused; its `denied` stays 0), `outcome="batch"` once a limit has had an admission
    /// answered from a batch, `outcome="deny_cache"` once it has had a denial answered by the
    /// deny cache, then, once
    /// a settlement changed something, `ratelimit_settled_units_total{limit="...",
    /// direction="refunded|charged"}` for the limits that settled.
    pub fn render_prometheus(&self) -> String {
        let m = self.merged();
        let mut out = String::from(
            "# HELP ratelimit_decisions_total Rate-limit decisions per limit: allowed, denied, degraded (made without Redis), and shadow_denied (a shadow limit would have refused; let through).\n# TYPE ratelimit_decisions_total counter\n",
        );
        // (batch and deny_cache: admissions and denials among those answered in the process.)
        for (name, c) in m.iter() {
            let n = escape(name);
            for (outcome, v) in [
                ("allowed", c.allowed),
                ("denied", c.denied),
                ("degraded", c.degraded),
            ] {
                out.push_str(&format!(
                    "ratelimit_decisions_total{{limit=\"{n}\",outcome=\"{outcome}\"}} {v}\n"
                ));
            }
            if c.shadow {
                out.push_str(&format!(
                    "ratelimit_decisions_total{{limit=\"{n}\",outcome=\"shadow_denied\"}} {}\n",
                    c.shadow_denied
                ));
            }
            for (outcome, v) in [("batch", c.batch), ("deny_cache", c.deny_cache)] {
                if v > 0 {
                    out.push_str(&format!(
                        "ratelimit_decisions_total{{limit=\"{n}\",outcome=\"{outcome}\"}} {v}\n"
                    ));
                }
            }
        }
        let settled: Vec<_> = m
            .iter()
            .filter(|(_, c)| c.refunded > 0 || c.charged > 0)
            .collect();
        if !settled.is_empty() {
            out.push_str(
                "# HELP ratelimit_settled_units_total Units given back (refunded) or taken (charged) when reservations were settled with their actual cost.\n# TYPE ratelimit_settled_units_total counter\n",
            );
        }
        for (name, c) in settled {
            let n = escape(name);
            for (direction, v) in [("refunded", c.refunded), ("charged", c.charged)] {
                out.push_str(&format!(
                    "ratelimit_settled_units_total{{limit=\"{n}\",direction=\"{direction}\"}} {v}\n"
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text() {
        let m = Metrics::default();
        m.record("api", true, false);
        m.record("api", false, true);
        m.record("a\"b", true, false);
        assert_eq!(
            m.render_prometheus(),
            "# HELP ratelimit_decisions_total Rate-limit decisions per limit: allowed, denied, degraded (made without Redis), and shadow_denied (a shadow limit would have refused; let through).\n\
             # TYPE ratelimit_decisions_total counter\n\
             ratelimit_decisions_total{limit=\"a\\\"b\",outcome=\"allowed\"} 1\n\
             ratelimit_decisions_total{limit=\"a\\\"b\",outcome=\"denied\"} 0\n\
             ratelimit_decisions_total{limit=\"a\\\"b\",outcome=\"degraded\"} 0\n\
             ratelimit_decisions_total{limit=\"api\",outcome=\"allowed\"} 1\n\
             ratelimit_decisions_total{limit=\"api\",outcome=\"denied\"} 1\n\
             ratelimit_decisions_total{limit=\"api\",outcome=\"degraded\"} 1\n"
        );
        m.record_settled("api", -30);
        m.record_settled("api", 5);
        m.record_settled("api", 0);
        assert_eq!((m.counts("api").refunded, m.counts("api").charged), (30, 5));
        assert!(m.render_prometheus().ends_with(
            "ratelimit_decisions_total{limit=\"api\",outcome=\"degraded\"} 1\n\
             # HELP ratelimit_settled_units_total Units given back (refunded) or taken (charged) when reservations were settled with their actual cost.\n\
             # TYPE ratelimit_settled_units_total counter\n\
             ratelimit_settled_units_total{limit=\"api\",direction=\"refunded\"} 30\n\
             ratelimit_settled_units_total{limit=\"api\",direction=\"charged\"} 5\n"
        ));
    }

    #[test]
    fn shadow_denials_are_their_own_outcome() {
        let m = Metrics::default();
        m.record_shadow("new", true, false);
        m.record_shadow("new", false, false);
        m.record_shadow("new", false, true);
        let c = m.counts("new");
        assert_eq!(
            (c.allowed, c.denied, c.shadow_denied, c.degraded, c.shadow),
            (1, 0, 2, 1, true)
        );
        assert!(m.render_prometheus().ends_with(
            "ratelimit_decisions_total{limit=\"new\",outcome=\"allowed\"} 1\n\
             ratelimit_decisions_total{limit=\"new\",outcome=\"denied\"} 0\n\
             ratelimit_decisions_total{limit=\"new\",outcome=\"degraded\"} 1\n\
             ratelimit_decisions_total{limit=\"new\",outcome=\"shadow_denied\"} 2\n"
        ));
    }

    /// Counted from many threads (each in its shard), the counts and the text add them up.
    #[test]
    fn threads_count_apart_and_are_read_together() {
        let m = std::sync::Arc::new(Metrics::default());
        let threads: Vec<_> = (0..40)
            .map(|t| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        m.record("api", t % 2 == 0, false);
                    }
                    m.record_shadow("new", false, t == 0);
                    m.record_settled("api", -1);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let c = m.counts("api");
        assert_eq!((c.allowed, c.denied, c.refunded), (2000, 2000, 40));
        let n = m.counts("new");
        assert_eq!((n.shadow_denied, n.degraded, n.shadow), (40, 1, true));
        assert!(m.render_prometheus().contains(
            "ratelimit_decisions_total{limit=\"api\",outcome=\"allowed\"} 2000\n\
             ratelimit_decisions_total{limit=\"api\",outcome=\"denied\"} 2000\n\
             ratelimit_decisions_total{limit=\"api\",outcome=\"degraded\"} 0\n\
             ratelimit_decisions_total{limit=\"new\",outcome=\"allowed\"} 0\n"
        ));
        assert!(
            m.render_prometheus().ends_with(
                "ratelimit_settled_units_total{limit=\"api\",direction=\"charged\"} 0\n"
            )
        );
    }
}
