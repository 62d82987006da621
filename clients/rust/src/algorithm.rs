//! The algorithms of the module and their parameters.

/// A concurrency limit: at most `limit` leases held at once on a key, each for `lease_sec`
/// seconds unless renewed or released first (`RL.ACQUIRE key limit lease_sec lease_id`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Concurrency {
    pub limit: u64,
    pub lease_sec: f64,
}

impl Concurrency {
    /// The parameters after the key, without the lease id.
    pub fn params(&self) -> Vec<String> {
        vec![self.limit.to_string(), num(self.lease_sec)]
    }
}

/// One algorithm with its parameters, as the matching `RL.*` command takes them.
#[derive(Clone, Debug, PartialEq)]
pub enum Algorithm {
    /// `RL.TOKENBUCKET key capacity refill_per_sec`
    TokenBucket { capacity: u64, refill_per_sec: f64 },
    /// `RL.LEAKYBUCKET key capacity leak_per_sec`
    LeakyBucket { capacity: u64, leak_per_sec: f64 },
    /// `RL.FIXEDWINDOW key limit window_sec`
    FixedWindow { limit: u64, window_sec: f64 },
    /// `RL.SLIDINGWINDOW key limit window_sec`
    SlidingWindow { limit: u64, window_sec: f64 },
    /// `RL.SLIDINGLOG key limit window_sec` (not available inside `RL.ALL`)
    SlidingLog { limit: u64, window_sec: f64 },
    /// `RL.GCRA key max_burst count_per_period period_sec`: `max_burst + 1` at once
    Gcra {
        max_burst: u64,
        count_per_period: u64,
        period_sec: f64,
    },
    /// `RL.ACQUIRE key limit lease_sec lease_id`: slots held by leases rather than units spent
    /// (taken with [`Client::acquire`](crate::Client::acquire); `CONCURRENCY` inside `RL.ALL`,
    /// where it takes one slot whatever the cost).
    Concurrency(Concurrency),
}

impl From<Concurrency> for Algorithm {
    fn from(c: Concurrency) -> Self {
        Algorithm::Concurrency(c)
    }
}

/// Plain decimal, as the module accepts (Rust's `Display` for `f64` never uses an exponent).
fn num(v: f64) -> String {
    format!("{v}")
}

/// `v` as the next argument of `cmd`, the bytes [`num`] writes: a whole number below 2^53 as
/// an integer (what `Display` writes for it), anything else through the formatter into a
/// buffer on the stack (a `String` only for a decimal longer than 64 bytes).
fn arg_f64(cmd: &mut redis::Cmd, v: f64) {
    if v.fract() == 0.0 && v.abs() < 9_007_199_254_740_992.0 && !(v == 0.0 && v.is_sign_negative())
    {
        cmd.arg(v as i64);
        return;
    }
    struct Buf {
        bytes: [u8; 64],
        len: usize,
    }
    impl std::fmt::Write for Buf {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let end = self.len + s.len();
            self.bytes
                .get_mut(self.len..end)
                .ok_or(std::fmt::Error)?
                .copy_from_slice(s.as_bytes());
            self.len = end;
            Ok(())
        }
    }
    let mut buf = Buf {
        bytes: [0; 64],
        len: 0,
    };
    match std::fmt::write(&mut buf, format_args!("{v}")) {
        Ok(()) => cmd.arg(&buf.bytes[..buf.len]),
        Err(_) => cmd.arg(num(v)),
    };
}

impl Algorithm {
    /// The command name (`RL.TOKENBUCKET`).
    pub fn command(&self) -> &'static str {
        match self {
            Algorithm::TokenBucket { .. } => "RL.TOKENBUCKET",
            Algorithm::LeakyBucket { .. } => "RL.LEAKYBUCKET",
            Algorithm::FixedWindow { .. } => "RL.FIXEDWINDOW",
            Algorithm::SlidingWindow { .. } => "RL.SLIDINGWINDOW",
            Algorithm::SlidingLog { .. } => "RL.SLIDINGLOG",
            Algorithm::Gcra { .. } => "RL.GCRA",
            Algorithm::Concurrency(_) => "RL.ACQUIRE",
        }
    }

    /// The keyword inside `RL.ALL` (`TOKENBUCKET`, `CONCURRENCY`).
    pub fn keyword(&self) -> &'static str {
        match self {
            Algorithm::Concurrency(_) => "CONCURRENCY",
            _ => &self.command()[3..],
        }
    }

    /// The concurrency limit, if this is one.
    pub fn concurrency(&self) -> Option<&Concurrency> {
        match self {
            Algorithm::Concurrency(c) => Some(c),
            _ => None,
        }
    }

    /// The Lua twin in `lua-reference/`.
    pub(crate) fn script(&self) -> &'static str {
        match self {
            Algorithm::TokenBucket { .. } => {
                include_str!("../../../lua-reference/token_bucket.lua")
            }
            Algorithm::LeakyBucket { .. } => {
                include_str!("../../../lua-reference/leaky_bucket.lua")
            }
            Algorithm::FixedWindow { .. } => {
                include_str!("../../../lua-reference/fixed_window.lua")
            }
            Algorithm::SlidingWindow { .. } => {
                include_str!("../../../lua-reference/sliding_window.lua")
            }
            Algorithm::SlidingLog { .. } => include_str!("../../../lua-reference/sliding_log.lua"),
            Algorithm::Gcra { .. } => include_str!("../../../lua-reference/gcra.lua"),
            Algorithm::Concurrency(_) => include_str!("../../../lua-reference/acquire.lua"),
        }
    }

    /// The parameters after the key, without the cost.
    pub fn params(&self) -> Vec<String> {
        match *self {
            Algorithm::TokenBucket {
                capacity,
                refill_per_sec: r,
            }
            | Algorithm::LeakyBucket {
                capacity,
                leak_per_sec: r,
            } => vec![capacity.to_string(), num(r)],
            Algorithm::FixedWindow { limit, window_sec }
            | Algorithm::SlidingWindow { limit, window_sec }
            | Algorithm::SlidingLog { limit, window_sec } => {
                vec![limit.to_string(), num(window_sec)]
            }
            Algorithm::Gcra {
                max_burst,
                count_per_period,
                period_sec,
            } => vec![
                max_burst.to_string(),
                count_per_period.to_string(),
                num(period_sec),
            ],
            Algorithm::Concurrency(c) => c.params(),
        }
    }

    /// The parameters after the key appended to `cmd`, the bytes of [`params`] without a
    /// string made for each.
    ///
    /// [`params`]: Algorithm::params
    pub(crate) fn write_params(&self, cmd: &mut redis::Cmd) {
        match *self {
            Algorithm::TokenBucket {
                capacity: n,
                refill_per_sec: f,
            }
            | Algorithm::LeakyBucket {
                capacity: n,
                leak_per_sec: f,
            }
            | Algorithm::FixedWindow {
                limit: n,
                window_sec: f,
            }
            | Algorithm::SlidingWindow {
                limit: n,
                window_sec: f,
            }
            | Algorithm::SlidingLog {
                limit: n,
                window_sec: f,
            }
            | Algorithm::Concurrency(Concurrency {
                limit: n,
                lease_sec: f,
            }) => {
                cmd.arg(n);
                arg_f64(cmd, f);
            }
            Algorithm::Gcra {
                max_burst,
                count_per_period,
                period_sec,
            } => {
                cmd.arg(max_burst).arg(count_per_period);
                arg_f64(cmd, period_sec);
            }
        }
    }

    /// The parameters as they identify the limit in the client's tables (a batch's, a
    /// denial's): integers in decimal, each `f64` by its bits in hex (exact as the decimal
    /// form, without formatting a float on every call).
    pub(crate) fn write_identity(&self, out: &mut String) {
        use crate::text::{push_hex, push_u64};
        // Written without the formatter: a batched request writes its limits' identities.
        let (first, second, float) = match *self {
            Algorithm::TokenBucket {
                capacity,
                refill_per_sec: r,
            }
            | Algorithm::LeakyBucket {
                capacity,
                leak_per_sec: r,
            } => (capacity, None, r),
            Algorithm::FixedWindow { limit, window_sec }
            | Algorithm::SlidingWindow { limit, window_sec }
            | Algorithm::SlidingLog { limit, window_sec } => (limit, None, window_sec),
            Algorithm::Gcra {
                max_burst,
                count_per_period,
                period_sec,
            } => (max_burst, Some(count_per_period), period_sec),
            Algorithm::Concurrency(c) => (c.limit, None, c.lease_sec),
        };
        for v in std::iter::once(first).chain(second) {
            out.push(' ');
            push_u64(out, v);
        }
        out.push(' ');
        push_hex(out, float.to_bits());
    }

    /// The limit the commands report (field 5).
    pub fn limit(&self) -> u64 {
        match *self {
            Algorithm::TokenBucket { capacity, .. } | Algorithm::LeakyBucket { capacity, .. } => {
                capacity
            }
            Algorithm::FixedWindow { limit, .. }
            | Algorithm::SlidingWindow { limit, .. }
            | Algorithm::SlidingLog { limit, .. } => limit,
            Algorithm::Gcra { max_burst, .. } => max_burst.saturating_add(1),
            Algorithm::Concurrency(c) => c.limit,
        }
    }

    /// The sustained rate in units per second (for a concurrency limit: every slot taken once
    /// per lease).
    pub fn rate_per_sec(&self) -> f64 {
        match *self {
            Algorithm::TokenBucket { refill_per_sec, .. } => refill_per_sec,
            Algorithm::LeakyBucket { leak_per_sec, .. } => leak_per_sec,
            Algorithm::FixedWindow { limit, window_sec }
            | Algorithm::SlidingWindow { limit, window_sec }
            | Algorithm::SlidingLog { limit, window_sec } => limit as f64 / window_sec,
            Algorithm::Gcra {
                count_per_period,
                period_sec,
                ..
            } => count_per_period as f64 / period_sec,
            Algorithm::Concurrency(c) => c.limit as f64 / c.lease_sec,
        }
    }

    /// The window of the policy in whole seconds (rounded up, at least 1): the window for the
    /// window algorithms, the lease for a concurrency limit, the time to go from empty to full
    /// for the others.
    pub fn window_secs(&self) -> u64 {
        let w = match *self {
            Algorithm::FixedWindow { window_sec, .. }
            | Algorithm::SlidingWindow { window_sec, .. }
            | Algorithm::SlidingLog { window_sec, .. } => window_sec,
            Algorithm::Concurrency(c) => c.lease_sec,
            _ => self.limit() as f64 / self.rate_per_sec(),
        };
        (w.ceil() as u64).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_the_integers_then_the_float_bits_in_hexadecimal() {
        let cases = [
            (
                Algorithm::TokenBucket {
                    capacity: 10,
                    refill_per_sec: 2.5,
                },
                format!(" 10 {:x}", 2.5f64.to_bits()),
            ),
            (
                Algorithm::LeakyBucket {
                    capacity: 0,
                    leak_per_sec: 0.001,
                },
                format!(" 0 {:x}", 0.001f64.to_bits()),
            ),
            (
                Algorithm::FixedWindow {
                    limit: u64::MAX,
                    window_sec: 60.0,
                },
                format!(" {} {:x}", u64::MAX, 60f64.to_bits()),
            ),
            (
                Algorithm::SlidingWindow {
                    limit: 7,
                    window_sec: 1.0,
                },
                format!(" 7 {:x}", 1f64.to_bits()),
            ),
            (
                Algorithm::SlidingLog {
                    limit: 100,
                    window_sec: 3600.0,
                },
                format!(" 100 {:x}", 3600f64.to_bits()),
            ),
            (
                Algorithm::Gcra {
                    max_burst: 5,
                    count_per_period: 12,
                    period_sec: 0.5,
                },
                format!(" 5 12 {:x}", 0.5f64.to_bits()),
            ),
            (
                Algorithm::from(Concurrency {
                    limit: 3,
                    lease_sec: 2.5,
                }),
                format!(" 3 {:x}", 2.5f64.to_bits()),
            ),
        ];
        for (a, want) in cases {
            let mut got = String::new();
            a.write_identity(&mut got);
            assert_eq!(got, want, "{a:?}");
        }
    }

    /// What [`Algorithm::write_params`] appends to a command, as strings.
    fn written_params(a: &Algorithm) -> Vec<String> {
        let mut cmd = redis::cmd("X");
        a.write_params(&mut cmd);
        cmd.args_iter()
            .skip(1)
            .map(|arg| match arg {
                redis::Arg::Simple(b) => String::from_utf8(b.to_vec()).expect("utf-8"),
                _ => panic!("not a simple argument"),
            })
            .collect()
    }

    /// The bytes written into a command are those of `params`, for floats of every kind.
    #[test]
    fn written_params_are_the_params() {
        let floats = [
            0.0,
            -0.0,
            1.0,
            2.5,
            0.1,
            0.0000001,
            1e-300,
            1e6,
            1e15,
            9_007_199_254_740_991.0,
            9_007_199_254_740_992.0,
            1e21,
            1e300,
            f64::MAX,
            f64::MIN_POSITIVE,
            1.0 / 3.0,
            -7.0,
        ];
        for f in floats {
            for a in [
                Algorithm::TokenBucket {
                    capacity: u64::MAX,
                    refill_per_sec: f,
                },
                Algorithm::SlidingLog {
                    limit: 0,
                    window_sec: f,
                },
                Algorithm::Gcra {
                    max_burst: 4,
                    count_per_period: 7,
                    period_sec: f,
                },
                Algorithm::from(Concurrency {
                    limit: 3,
                    lease_sec: f,
                }),
            ] {
                assert_eq!(written_params(&a), a.params(), "{a:?}");
            }
        }
    }

    #[test]
    fn params_are_plain_decimals() {
        let a = Algorithm::TokenBucket {
            capacity: 10,
            refill_per_sec: 0.0000001,
        };
        assert_eq!(a.params(), vec!["10".to_string(), "0.0000001".to_string()]);
        let mut written = String::new();
        a.write_identity(&mut written);
        assert_eq!(written, format!(" 10 {:x}", 0.0000001f64.to_bits()));
        assert_eq!(a.keyword(), "TOKENBUCKET");
        assert_eq!(a.params(), written_params(&a));
        let g = Algorithm::Gcra {
            max_burst: 4,
            count_per_period: 1,
            period_sec: 2.5,
        };
        assert_eq!(g.params(), vec!["4", "1", "2.5"]);
        assert_eq!(g.limit(), 5);
        assert_eq!(g.window_secs(), 13);
        let w = Algorithm::FixedWindow {
            limit: 3,
            window_sec: 0.5,
        };
        assert_eq!(w.window_secs(), 1);
        assert_eq!(w.rate_per_sec(), 6.0);
        let c = Algorithm::from(Concurrency {
            limit: 3,
            lease_sec: 2.5,
        });
        assert_eq!(
            (
                c.command(),
                c.keyword(),
                c.params(),
                c.limit(),
                c.window_secs()
            ),
            (
                "RL.ACQUIRE",
                "CONCURRENCY",
                vec!["3".to_string(), "2.5".to_string()],
                3,
                3
            )
        );
    }
}
