//! The most-denied keys, in a fixed number of slots (`RL.TOP`): the Space-Saving algorithm
//! (Metwally, Agrawal, El Abbadi, 2005). A denial of a tracked key counts one more; a denial of
//! an untracked key takes a free slot, or else the slot with the fewest denials, whose count it
//! inherits plus one (and records as its `error`). So every count overestimates the key's true
//! denials by at most its `error`, and `error` is at most `N / slots` for `N` denials in all: a
//! key denied more than `N / slots` times is always listed.
//!
//! Per server and in module memory only (not replicated, not persisted), like `SLOWLOG`. Each
//! denial costs a hash lookup and an ordered-set update, O(log slots); memory is fixed by the
//! number of slots, however many keys exist. No Redis types here.

use std::collections::{BTreeSet, HashMap};
use std::ffi::CStr;
use std::sync::Arc;

/// One tracked key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: Arc<[u8]>,
    /// Denials counted for the key (at most `error` more than it really had).
    pub denied: u64,
    /// The most by which `denied` may overcount: the count of the key this one replaced.
    pub error: u64,
    /// The command of the key's latest denial.
    pub command: &'static CStr,
    /// Unix milliseconds of its first and latest denial since it was tracked.
    pub first_denied_ms: i64,
    pub last_denied_ms: i64,
}

#[derive(Debug, Default)]
pub struct Top {
    slots: usize,
    entries: Vec<Entry>,
    by_key: HashMap<Arc<[u8]>, usize>,
    /// `(denied, slot)` of every entry, as it was when last ordered: a tracked key's denial only
    /// counts in its entry (so the common case costs a hash lookup), and an entry whose count
    /// moved on is put back in order when it comes up as the one to replace.
    order: BTreeSet<(u64, usize)>,
}

impl Top {
    pub fn new(slots: usize) -> Top {
        Top {
            slots,
            ..Top::default()
        }
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    /// One denial of `key` by `command` at `now_ms`.
    pub fn denied(&mut self, key: &[u8], command: &'static CStr, now_ms: i64) {
        if self.slots == 0 {
            return;
        }
        if let Some(&i) = self.by_key.get(key) {
            if let Some(e) = self.entries.get_mut(i) {
                e.denied += 1;
                e.command = command;
                e.last_denied_ms = now_ms;
            }
            return;
        }
        let key: Arc<[u8]> = Arc::from(key);
        if self.entries.len() < self.slots {
            let i = self.entries.len();
            self.entries.push(Entry {
                key: Arc::clone(&key),
                denied: 1,
                error: 0,
                command,
                first_denied_ms: now_ms,
                last_denied_ms: now_ms,
            });
            self.by_key.insert(key, i);
            self.order.insert((1, i));
            return;
        }
        // The entry with the fewest denials: the first in order whose count has not moved on
        // since it was ordered (one that has is put back where it now belongs).
        let (fewest, i) = loop {
            let Some((ordered, i)) = self.order.pop_first() else {
                return;
            };
            match self.entries.get(i) {
                Some(e) if e.denied == ordered => break (ordered, i),
                Some(e) => {
                    self.order.insert((e.denied, i));
                }
                None => {}
            }
        };
        if let Some(e) = self.entries.get_mut(i) {
            self.by_key.remove(&e.key);
            e.key = Arc::clone(&key);
            e.denied = fewest + 1;
            e.error = fewest;
            e.command = command;
            e.first_denied_ms = now_ms;
            e.last_denied_ms = now_ms;
            self.by_key.insert(key, i);
            self.order.insert((fewest + 1, i));
        }
    }

    /// The `count` most-denied keys, most first (ties: the most recently denied first).
    pub fn heaviest(&self, count: usize) -> Vec<Entry> {
        let mut out: Vec<&Entry> = self.entries.iter().collect();
        out.sort_by(|a, b| {
            b.denied
                .cmp(&a.denied)
                .then(b.last_denied_ms.cmp(&a.last_denied_ms))
                .then(a.key.cmp(&b.key))
        });
        out.into_iter().take(count).cloned().collect()
    }

    pub fn reset(&mut self) {
        *self = Top::new(self.slots);
    }

    /// A new number of slots: the heaviest keys are kept (0 turns tracking off and empties it).
    pub fn resize(&mut self, slots: usize) {
        let kept = self.heaviest(slots);
        *self = Top::new(slots);
        for (i, e) in kept.into_iter().enumerate() {
            self.by_key.insert(Arc::clone(&e.key), i);
            self.order.insert((e.denied, i));
            self.entries.push(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_exactly_while_every_key_has_a_slot() {
        let mut t = Top::new(3);
        for (i, k) in ["a", "b", "a", "c", "a", "b"].iter().enumerate() {
            t.denied(k.as_bytes(), c"RL.GCRA", 1000 + i as i64);
        }
        let top = t.heaviest(10);
        let rows: Vec<(&[u8], u64, u64, i64, i64)> = top
            .iter()
            .map(|e| {
                (
                    &e.key[..],
                    e.denied,
                    e.error,
                    e.first_denied_ms,
                    e.last_denied_ms,
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                (&b"a"[..], 3, 0, 1000, 1004),
                (&b"b"[..], 2, 0, 1001, 1005),
                (&b"c"[..], 1, 0, 1003, 1003)
            ]
        );
        assert_eq!(t.heaviest(1).len(), 1);
    }

    #[test]
    fn a_new_key_takes_the_fewest_count_and_records_it_as_error() {
        let mut t = Top::new(2);
        for k in ["a", "a", "a", "b", "c"] {
            t.denied(k.as_bytes(), c"RL.ALL", 5);
        }
        let top = t.heaviest(2);
        assert_eq!(
            (&top[0].key[..], top[0].denied, top[0].error),
            (&b"a"[..], 3, 0)
        );
        assert_eq!(
            (&top[1].key[..], top[1].denied, top[1].error),
            (&b"c"[..], 2, 1)
        );
    }

    #[test]
    fn heavy_keys_among_far_more_keys_than_slots_are_listed_within_the_bound() {
        let slots = 50;
        let mut t = Top::new(slots);
        let mut truth: HashMap<Vec<u8>, u64> = HashMap::new();
        let mut n = 0u64;
        // 20,000 light keys, each denied once or twice, and 5 heavy ones denied 2,000 times
        // each, interleaved: more than N / slots, so they must be listed.
        for round in 0..20_000u64 {
            let light = format!("light:{round}").into_bytes();
            for _ in 0..(1 + round % 2) {
                t.denied(&light, c"RL.TOKENBUCKET", 0);
                *truth.entry(light.clone()).or_default() += 1;
                n += 1;
            }
            if round % 10 == 0 {
                let heavy = format!("heavy:{}", round % 50 / 10).into_bytes();
                for _ in 0..5 {
                    t.denied(&heavy, c"RL.TOKENBUCKET", 0);
                    *truth.entry(heavy.clone()).or_default() += 1;
                    n += 1;
                }
            }
        }
        let bound = n / slots as u64;
        assert!(truth[&b"heavy:0".to_vec()] > bound, "{bound}");
        let top = t.heaviest(5);
        let mut names: Vec<String> = top
            .iter()
            .map(|e| String::from_utf8(e.key.to_vec()).unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["heavy:0", "heavy:1", "heavy:2", "heavy:3", "heavy:4"]
        );
        for e in t.heaviest(slots) {
            let real = truth[&e.key.to_vec()];
            assert!(
                e.denied >= real && e.denied - e.error <= real,
                "{e:?} {real}"
            );
            assert!(e.error <= bound, "{e:?} bound {bound}");
        }
    }

    #[test]
    fn resizing_keeps_the_heaviest_and_zero_turns_it_off() {
        let mut t = Top::new(3);
        for k in ["a", "a", "a", "b", "b", "c"] {
            t.denied(k.as_bytes(), c"RL.GCRA", 1);
        }
        t.resize(2);
        let keys: Vec<Vec<u8>> = t.heaviest(9).into_iter().map(|e| e.key.to_vec()).collect();
        assert_eq!(keys, [b"a".to_vec(), b"b".to_vec()]);
        t.denied(b"a", c"RL.GCRA", 2);
        assert_eq!(t.heaviest(1)[0].denied, 4);
        t.resize(0);
        t.denied(b"a", c"RL.GCRA", 3);
        assert!(t.heaviest(9).is_empty());
        t.resize(2);
        t.denied(b"z", c"RL.GCRA", 4);
        t.reset();
        assert!(t.heaviest(9).is_empty());
        assert_eq!(t.slots(), 2);
    }
}
