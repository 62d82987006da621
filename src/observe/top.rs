//! The most-denied keys, in a fixed number of slots (`RL.TOP`): the Space-Saving algorithm
//! (Metwally, Agrawal, El Abbadi, 2005). A denial of a tracked key counts one more; a denial of
//! an untracked key takes a free slot, or else the slot with the fewest denials, whose count it
//! inherits plus one (and records as its `error`). So every count overestimates the key's true
//! denials by at most its `error`, and `error` is at most `N / slots` for `N` denials in all: a
//! key denied more than `N / slots` times is always listed.
//!
//! Per server and in module memory only (not replicated, not persisted), like `SLOWLOG`. No Redis
//! types here.
//!
//! The structure is the paper's Stream-Summary, on index-linked pools (no pointers, no `unsafe`):
//!
//! - **Slots** hold the tracked keys, each with its own key buffer, its 64-bit hash and its place
//!   in its bucket's list.
//! - **Buckets** group the slots with the same count. They form a doubly linked list ordered by
//!   count, from the `lowest`; each keeps a doubly linked list of its slots, least recently
//!   counted first: a slot joins a bucket at the tail, and the slot replaced is the head of the
//!   lowest bucket. Counting a slot once more moves it to the next bucket if that one counts
//!   exactly one more, else to a new bucket right after (or, alone in its bucket, just bumps the
//!   bucket's count). Emptied buckets go to a free list and are reused.
//! - **The index** is an open-addressing table of slot numbers (linear probing, at most a
//!   quarter full, deletion by backward shift), hashed with a per-`Top` seeded multiply-and-fold hash,
//!   so key names cannot be chosen to make probe sequences long. The slot of the latest denial
//!   is checked first: a key denied again right away is found without hashing.
//!
//! So each denial is O(1) worst case: at most one hash of the key, a short probe, and a constant number
//! of list updates. Every pool is reserved for the number of slots up front and a replaced slot
//! reuses its key buffer, so once warm (all slots taken, buffers as long as the keys) a denial
//! allocates nothing. Memory is fixed by the number of slots, however many keys exist.

use std::cmp::Ordering;
use std::collections::hash_map::RandomState;
use std::ffi::CStr;
use std::hash::BuildHasher;

/// One tracked key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: Vec<u8>,
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

/// No slot, no bucket, no link.
const NONE: u32 = u32::MAX;

/// The most slots tracked, whatever `slots` says: slot and bucket numbers stay well below
/// `NONE`, and the index's size (twice this) fits the `u32` arithmetic.
const MAX_SLOTS: usize = 1 << 30;

/// The fewest places in the index.
const MIN_INDEX: usize = 8;

/// A tracked key: its entry (whose `denied` is always its bucket's count), hash and links.
#[derive(Debug)]
struct Slot {
    entry: Entry,
    hash: u64,
    bucket: u32,
    /// The slot counted just before (toward the head) and just after (toward the tail) in the
    /// same bucket.
    prev: u32,
    next: u32,
}

/// The slots with one count.
#[derive(Debug)]
struct Bucket {
    count: u64,
    /// The buckets with the next lower and next higher count; a free bucket's `next` is the
    /// next free one.
    prev: u32,
    next: u32,
    /// Its least and most recently counted slots.
    head: u32,
    tail: u32,
}

#[derive(Debug)]
pub struct Top {
    slots: usize,
    entries: Vec<Slot>,
    buckets: Vec<Bucket>,
    /// The first free bucket, chained through `next`.
    free: u32,
    /// The bucket with the fewest denials.
    lowest: u32,
    /// Slot numbers (or `NONE`), a power of two long, at least four times the slots.
    index: Vec<u32>,
    hasher: KeyHasher,
    /// The slot of the latest denial: a key denied again right away (a client hammering its
    /// limit) is found by one comparison, without hashing.
    last: u32,
}

impl Default for Top {
    fn default() -> Top {
        Top::new(0)
    }
}

/// `RL.TOP`'s order: the most denied first, then the most recently denied, then by key.
fn heavier(a: &Entry, b: &Entry) -> Ordering {
    b.denied
        .cmp(&a.denied)
        .then(b.last_denied_ms.cmp(&a.last_denied_ms))
        .then(a.key.cmp(&b.key))
}

impl Top {
    pub fn new(slots: usize) -> Top {
        Top::with_hasher(slots, KeyHasher::new())
    }

    fn with_hasher(slots: usize, hasher: KeyHasher) -> Top {
        let tracked = slots.min(MAX_SLOTS);
        let places = tracked.saturating_mul(4).next_power_of_two().max(MIN_INDEX);
        Top {
            slots,
            entries: Vec::with_capacity(tracked),
            buckets: Vec::with_capacity(tracked),
            free: NONE,
            lowest: NONE,
            index: vec![NONE; places],
            hasher,
            last: NONE,
        }
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    /// How many keys it tracks at most.
    fn tracked(&self) -> usize {
        self.slots.min(MAX_SLOTS)
    }

    /// One denial of `key` by `command` at `now_ms`.
    pub fn denied(&mut self, key: &[u8], command: &'static CStr, now_ms: i64) {
        if self.tracked() == 0 {
            return;
        }
        // The latest denied key is checked before hashing (its hash is then not needed).
        let (hash, found) = if self
            .slot(self.last)
            .is_some_and(|slot| slot.entry.key == key)
        {
            (0, Ok(self.last))
        } else {
            let hash = self.hasher.hash(key);
            (hash, self.find(hash, key))
        };
        let place = match found {
            Ok(s) => {
                self.last = s;
                if let Some(slot) = self.slot_mut(s) {
                    slot.entry.command = command;
                    slot.entry.last_denied_ms = now_ms;
                }
                self.count(s);
                return;
            }
            Err(place) => place,
        };
        if self.entries.len() < self.tracked() {
            let s = self.entries.len() as u32;
            self.entries.push(Slot {
                entry: Entry {
                    key: key.to_vec(),
                    denied: 1,
                    error: 0,
                    command,
                    first_denied_ms: now_ms,
                    last_denied_ms: now_ms,
                },
                hash,
                bucket: NONE,
                prev: NONE,
                next: NONE,
            });
            if let Some(p) = self.index.get_mut(place) {
                *p = s;
            }
            self.last = s;
            let b = match self.bucket(self.lowest) {
                Some(lowest) if lowest.count == 1 => self.lowest,
                _ => self.new_bucket(1, NONE, self.lowest),
            };
            self.append(s, b);
            return;
        }
        // Full: the least recently counted of the fewest counted takes the key.
        let Some(lowest) = self.bucket(self.lowest) else {
            return;
        };
        let (s, fewest) = (lowest.head, lowest.count);
        let Some(old_hash) = self.slot(s).map(|slot| slot.hash) else {
            return;
        };
        self.unindex(s, old_hash);
        if let Some(slot) = self.slot_mut(s) {
            let e = &mut slot.entry;
            if e.key.len() == key.len() {
                e.key.copy_from_slice(key);
            } else {
                e.key.clear();
                e.key.extend_from_slice(key);
            }
            e.denied = fewest;
            e.error = fewest;
            e.command = command;
            e.first_denied_ms = now_ms;
            e.last_denied_ms = now_ms;
            slot.hash = hash;
        }
        self.index_insert(s, hash);
        self.last = s;
        self.count(s);
    }

    /// The `count` most-denied keys, most first (ties: the most recently denied first).
    pub fn heaviest(&self, count: usize) -> Vec<Entry> {
        let mut out: Vec<&Entry> = self.entries.iter().map(|s| &s.entry).collect();
        out.sort_by(|a, b| heavier(a, b));
        out.into_iter().take(count).cloned().collect()
    }

    pub fn reset(&mut self) {
        *self = Top::new(self.slots);
    }

    /// A new number of slots: the heaviest keys are kept (0 turns tracking off and empties it),
    /// with their counts, errors and times, and in the same order among equal counts.
    pub fn resize(&mut self, slots: usize) {
        let keep_count = slots.min(MAX_SLOTS);
        let mut by_weight: Vec<usize> = (0..self.entries.len()).collect();
        by_weight.sort_by(|&a, &b| match (self.entries.get(a), self.entries.get(b)) {
            (Some(a), Some(b)) => heavier(&a.entry, &b.entry),
            _ => Ordering::Equal,
        });
        let mut keep = vec![false; self.entries.len()];
        for &i in by_weight.iter().take(keep_count) {
            if let Some(k) = keep.get_mut(i) {
                *k = true;
            }
        }
        // The kept slots in list order: by count, least recently counted first.
        let mut in_order = Vec::with_capacity(keep_count.min(self.entries.len()));
        let mut b = self.lowest;
        while let Some(bucket) = self.bucket(b) {
            let mut s = bucket.head;
            while let Some(slot) = self.slot(s) {
                if keep.get(s as usize) == Some(&true) {
                    in_order.push(s as usize);
                }
                s = slot.next;
            }
            b = bucket.next;
        }
        let mut old: Vec<Option<Slot>> = std::mem::take(&mut self.entries)
            .into_iter()
            .map(Some)
            .collect();
        *self = Top::with_hasher(slots, self.hasher.clone());
        let mut highest = NONE;
        for i in in_order {
            if let Some(slot) = old.get_mut(i).and_then(Option::take) {
                highest = self.push_highest(slot, highest);
            }
        }
    }

    /// While rebuilding in list order: `slot` joins the tail of the highest bucket, or of a new
    /// one above it. Returns the highest bucket.
    fn push_highest(&mut self, mut slot: Slot, highest: u32) -> u32 {
        if self.entries.len() >= self.tracked() {
            return highest;
        }
        let s = self.entries.len() as u32;
        let (count, hash) = (slot.entry.denied, slot.hash);
        slot.bucket = NONE;
        slot.prev = NONE;
        slot.next = NONE;
        self.entries.push(slot);
        self.index_insert(s, hash);
        let b = match self.bucket(highest) {
            Some(h) if h.count == count => highest,
            _ => self.new_bucket(count, highest, NONE),
        };
        self.append(s, b);
        b
    }

    fn slot(&self, s: u32) -> Option<&Slot> {
        self.entries.get(s as usize)
    }

    fn slot_mut(&mut self, s: u32) -> Option<&mut Slot> {
        self.entries.get_mut(s as usize)
    }

    fn bucket(&self, b: u32) -> Option<&Bucket> {
        self.buckets.get(b as usize)
    }

    fn bucket_mut(&mut self, b: u32) -> Option<&mut Bucket> {
        self.buckets.get_mut(b as usize)
    }

    // The index.

    fn mask(&self) -> usize {
        self.index.len().wrapping_sub(1)
    }

    /// The slot tracking `key`, or else the empty place where it would go (past the end if the
    /// index had none, which its size rules out).
    fn find(&self, hash: u64, key: &[u8]) -> Result<u32, usize> {
        let mask = self.mask();
        let mut place = hash as usize & mask;
        for _ in 0..self.index.len() {
            let s = self.index.get(place).copied().unwrap_or(NONE);
            if s == NONE {
                return Err(place);
            }
            if let Some(slot) = self.slot(s)
                && slot.hash == hash
                && slot.entry.key == key
            {
                return Ok(s);
            }
            place = (place + 1) & mask;
        }
        Err(usize::MAX)
    }

    /// Puts slot `s` at the first empty place from its hash's.
    fn index_insert(&mut self, s: u32, hash: u64) {
        let mask = self.mask();
        let mut place = hash as usize & mask;
        for _ in 0..self.index.len() {
            match self.index.get_mut(place) {
                Some(p) if *p == NONE => {
                    *p = s;
                    return;
                }
                Some(_) => place = (place + 1) & mask,
                None => return,
            }
        }
    }

    /// Takes slot `s` (whose hash is `hash`) out of the index, shifting back the slots after it
    /// that may then sit nearer their hash's place, so no probe sequence is broken.
    fn unindex(&mut self, s: u32, hash: u64) {
        let mask = self.mask();
        let mut hole = hash as usize & mask;
        let mut found = false;
        for _ in 0..self.index.len() {
            match self.index.get(hole).copied() {
                Some(x) if x == s => {
                    found = true;
                    break;
                }
                Some(x) if x != NONE => hole = (hole + 1) & mask,
                _ => break,
            }
        }
        if !found {
            return;
        }
        let mut at = hole;
        for _ in 0..self.index.len() {
            at = (at + 1) & mask;
            let x = self.index.get(at).copied().unwrap_or(NONE);
            if x == NONE {
                break;
            }
            let home = self.slot(x).map_or(at, |slot| slot.hash as usize & mask);
            // `x` may fill the hole if the hole lies on its probe sequence: from `home` to `at`.
            if at.wrapping_sub(home) & mask >= at.wrapping_sub(hole) & mask {
                if let Some(p) = self.index.get_mut(hole) {
                    *p = x;
                }
                hole = at;
            }
        }
        if let Some(p) = self.index.get_mut(hole) {
            *p = NONE;
        }
    }

    // The buckets.

    /// A bucket counting `count`, linked between `prev` and `next` (either may be `NONE`).
    fn new_bucket(&mut self, count: u64, prev: u32, next: u32) -> u32 {
        let fresh = Bucket {
            count,
            prev,
            next,
            head: NONE,
            tail: NONE,
        };
        let b = if self.free != NONE {
            let b = self.free;
            self.free = self.bucket(b).map_or(NONE, |f| f.next);
            if let Some(f) = self.bucket_mut(b) {
                *f = fresh;
            }
            b
        } else {
            let b = self.buckets.len() as u32;
            self.buckets.push(fresh);
            b
        };
        match self.bucket_mut(prev) {
            Some(p) => p.next = b,
            None => self.lowest = b,
        }
        if let Some(n) = self.bucket_mut(next) {
            n.prev = b;
        }
        b
    }

    /// Takes slot `s` out of its bucket's list (the bucket stays, maybe empty).
    fn detach(&mut self, s: u32) {
        let Some(slot) = self.slot(s) else {
            return;
        };
        let (b, prev, next) = (slot.bucket, slot.prev, slot.next);
        match self.slot_mut(prev) {
            Some(p) => p.next = next,
            None => {
                if let Some(bucket) = self.bucket_mut(b) {
                    bucket.head = next;
                }
            }
        }
        match self.slot_mut(next) {
            Some(n) => n.prev = prev,
            None => {
                if let Some(bucket) = self.bucket_mut(b) {
                    bucket.tail = prev;
                }
            }
        }
    }

    /// Puts slot `s` (detached) at the tail of bucket `b`.
    fn append(&mut self, s: u32, b: u32) {
        let Some(bucket) = self.bucket(b) else {
            return;
        };
        let (tail, count) = (bucket.tail, bucket.count);
        if let Some(slot) = self.slot_mut(s) {
            slot.bucket = b;
            slot.prev = tail;
            slot.next = NONE;
            slot.entry.denied = count;
        }
        match self.slot_mut(tail) {
            Some(t) => t.next = s,
            None => {
                if let Some(bucket) = self.bucket_mut(b) {
                    bucket.head = s;
                }
            }
        }
        if let Some(bucket) = self.bucket_mut(b) {
            bucket.tail = s;
        }
    }

    /// Unlinks bucket `b` from the list and frees it, if it has no slot left.
    fn free_if_empty(&mut self, b: u32) {
        let Some(bucket) = self.bucket(b) else {
            return;
        };
        if bucket.head != NONE {
            return;
        }
        let (prev, next) = (bucket.prev, bucket.next);
        match self.bucket_mut(prev) {
            Some(p) => p.next = next,
            None => self.lowest = next,
        }
        if let Some(n) = self.bucket_mut(next) {
            n.prev = prev;
        }
        let free = self.free;
        if let Some(bucket) = self.bucket_mut(b) {
            bucket.prev = NONE;
            bucket.next = free;
            bucket.tail = NONE;
        }
        self.free = b;
    }

    /// Counts slot `s` once more: it moves to the tail of the bucket counting one more.
    fn count(&mut self, s: u32) {
        let Some(b) = self.slot(s).map(|slot| slot.bucket) else {
            return;
        };
        let Some(bucket) = self.bucket(b) else {
            return;
        };
        let (count, next, alone) = (
            bucket.count,
            bucket.next,
            bucket.head == s && bucket.tail == s,
        );
        let Some(more) = count.checked_add(1) else {
            return;
        };
        let target = match self.bucket(next) {
            Some(n) if n.count == more => next,
            _ if alone => {
                // No bucket counts `more`, and this one is the slot's alone: it counts on.
                if let Some(bucket) = self.bucket_mut(b) {
                    bucket.count = more;
                }
                if let Some(slot) = self.slot_mut(s) {
                    slot.entry.denied = more;
                }
                return;
            }
            _ => self.new_bucket(more, b, next),
        };
        self.detach(s);
        self.append(s, target);
        self.free_if_empty(b);
    }
}

#[cfg(test)]
impl Top {
    /// Panics unless the buckets, slots, free list and index agree.
    fn check(&self) {
        let n = self.entries.len();
        let tracked = self.tracked();
        assert!(n <= tracked, "{n} > {tracked}");
        let mut seen = vec![false; n];
        let (mut live, mut b, mut prev_b, mut prev_count) = (0, self.lowest, NONE, 0u64);
        while b != NONE {
            let bucket = &self.buckets[b as usize];
            assert_eq!(bucket.prev, prev_b, "bucket {b}'s prev");
            assert!(bucket.count > prev_count, "counts not increasing at {b}");
            assert_ne!(bucket.head, NONE, "empty bucket {b} in the list");
            let (mut s, mut prev_s) = (bucket.head, NONE);
            while s != NONE {
                let slot = &self.entries[s as usize];
                assert!(!seen[s as usize], "slot {s} twice");
                seen[s as usize] = true;
                assert_eq!(slot.bucket, b, "slot {s}'s bucket");
                assert_eq!(slot.prev, prev_s, "slot {s}'s prev");
                assert_eq!(slot.entry.denied, bucket.count, "slot {s}'s count");
                (prev_s, s) = (s, slot.next);
            }
            assert_eq!(bucket.tail, prev_s, "bucket {b}'s tail");
            live += 1;
            assert!(live <= self.buckets.len(), "bucket list loops");
            (prev_b, prev_count, b) = (b, bucket.count, bucket.next);
        }
        assert!(seen.iter().all(|&s| s), "a slot in no bucket");
        assert_eq!(self.lowest == NONE, n == 0);
        let (mut free, mut f) = (0, self.free);
        while f != NONE {
            free += 1;
            assert!(free <= self.buckets.len(), "free list loops");
            f = self.buckets[f as usize].next;
        }
        assert_eq!(
            live + free,
            self.buckets.len(),
            "a bucket neither live nor free"
        );
        assert!(self.buckets.len() <= tracked.max(1));
        assert!(self.entries.capacity() >= tracked && self.buckets.capacity() >= tracked);
        let places = self.index.len();
        assert!(places.is_power_of_two() && places >= 2 * tracked && places >= MIN_INDEX);
        assert_eq!(self.index.iter().filter(|&&s| s != NONE).count(), n);
        for (i, slot) in self.entries.iter().enumerate() {
            let key = slot.entry.key.as_slice();
            assert_eq!(slot.hash, self.hasher.hash(key), "slot {i}'s hash");
            assert_eq!(
                self.find(slot.hash, key),
                Ok(i as u32),
                "slot {i} not indexed"
            );
        }
    }
}

/// A seeded hash of key names for the index: a multiply-and-fold mix over 16 bytes at a time
/// (the 128-bit product of two words, its halves xored), keyed by two random words drawn once per
/// `Top`. Several times cheaper than SipHash on short keys, and a key name chosen without the
/// seed cannot aim at a place in the table.
#[derive(Debug, Clone)]
struct KeyHasher {
    seed: [u64; 2],
}

/// Odd constants (from the digits of pi) that spread the length and the final mix.
const MIX: [u64; 2] = [0x243F_6A88_85A3_08D3, 0x1319_8A2E_0370_7345];

fn fold(a: u64, b: u64) -> u64 {
    let product = u128::from(a) * u128::from(b);
    (product as u64) ^ ((product >> 64) as u64)
}

impl KeyHasher {
    fn new() -> KeyHasher {
        // The standard library's per-process random keys, drawn through its SipHash.
        let random = RandomState::new();
        KeyHasher {
            seed: [random.hash_one(MIX[0]), random.hash_one(MIX[1])],
        }
    }

    fn hash(&self, key: &[u8]) -> u64 {
        let [s0, s1] = self.seed;
        let mut h = s0 ^ (key.len() as u64).wrapping_mul(MIX[0]);
        let mut rest = key;
        while let Some((chunk, tail)) = rest.split_first_chunk::<16>() {
            let (a, b) = chunk.split_at(8);
            h = fold(word(a) ^ s1 ^ h, word(b) ^ s0);
            rest = tail;
        }
        // The last 1..=15 bytes: two words that may overlap (the length is already mixed in).
        if let (Some(a), Some(b)) = (rest.first_chunk::<8>(), rest.last_chunk::<8>()) {
            h = fold(u64::from_le_bytes(*a) ^ s1 ^ h, u64::from_le_bytes(*b) ^ s0);
        } else if !rest.is_empty() {
            h = fold(word(rest) ^ s1 ^ h, s0);
        }
        fold(h ^ s1, MIX[1])
    }
}

/// Eight bytes as a little-endian word (fewer read as zeros).
fn word(bytes: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    let n = bytes.len().min(8);
    if let (Some(dst), Some(src)) = (w.get_mut(..n), bytes.get(..n)) {
        dst.copy_from_slice(src);
    }
    u64::from_le_bytes(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_hash_spreads_similar_names_evenly() {
        let h = KeyHasher::new();
        // 200,000 names differing in a few digits (lengths 1 to 24), into 4,096 places by
        // their low bits and by their high bits: no place gets more than twice its share.
        let mut low = vec![0u32; 4096];
        let mut high = vec![0u32; 4096];
        for i in 0..200_000u64 {
            let name = format!("{}{i}", &"rl:{tenant}:user:x"[..(i % 19) as usize]);
            let v = h.hash(name.as_bytes());
            low[(v & 4095) as usize] += 1;
            high[(v >> 52) as usize] += 1;
        }
        let share = 200_000 / 4096;
        for counts in [&low, &high] {
            let most = counts.iter().copied().max().unwrap_or(0);
            assert!(most < 2 * share, "{most} against a share of {share}");
        }
        // The length counts: trailing zero bytes make another key.
        assert_ne!(h.hash(b"a"), h.hash(b"a\0"));
        assert_ne!(h.hash(b""), h.hash(b"\0"));
        // Another seed, another hash.
        assert_ne!(KeyHasher::new().hash(b"k"), KeyHasher::new().hash(b"k"));
    }
    use std::collections::HashMap;

    #[test]
    fn counts_exactly_while_every_key_has_a_slot() {
        let mut t = Top::new(3);
        for (i, k) in ["a", "b", "a", "c", "a", "b"].iter().enumerate() {
            t.denied(k.as_bytes(), c"RL.GCRA", 1000 + i as i64);
        }
        t.check();
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
        t.check();
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
        t.check();
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
        t.check();
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
        t.check();
        assert!(t.heaviest(9).is_empty());
        assert_eq!(t.slots(), 2);
    }

    /// Space-Saving written plainly: a list of entries, each with the step it was last counted
    /// at; the one replaced has the fewest denials, then the oldest step.
    struct Model {
        slots: usize,
        step: u64,
        entries: Vec<(Entry, u64)>,
    }

    impl Model {
        fn new(slots: usize) -> Model {
            Model {
                slots,
                step: 0,
                entries: Vec::new(),
            }
        }

        fn denied(&mut self, key: &[u8], command: &'static CStr, now_ms: i64) {
            self.step += 1;
            if self.slots == 0 {
                return;
            }
            if let Some((e, at)) = self.entries.iter_mut().find(|(e, _)| e.key == key) {
                e.denied += 1;
                e.command = command;
                e.last_denied_ms = now_ms;
                *at = self.step;
                return;
            }
            let fresh = Entry {
                key: key.to_vec(),
                denied: 1,
                error: 0,
                command,
                first_denied_ms: now_ms,
                last_denied_ms: now_ms,
            };
            if self.entries.len() < self.slots {
                self.entries.push((fresh, self.step));
                return;
            }
            let (e, at) = self
                .entries
                .iter_mut()
                .min_by_key(|(e, at)| (e.denied, *at))
                .unwrap();
            *e = Entry {
                denied: e.denied + 1,
                error: e.denied,
                ..fresh
            };
            *at = self.step;
        }

        fn resize(&mut self, slots: usize) {
            self.entries.sort_by(|(a, _), (b, _)| heavier(a, b));
            self.entries.truncate(slots);
            self.slots = slots;
        }

        fn heaviest(&self) -> Vec<Entry> {
            let mut out: Vec<Entry> = self.entries.iter().map(|(e, _)| e.clone()).collect();
            out.sort_by(heavier);
            out
        }
    }

    /// xorshift64*.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
    }

    const COMMANDS: [&CStr; 3] = [c"RL.GCRA", c"RL.TOKENBUCKET", c"RL.ALL"];

    /// `steps` random denials (a few hot keys among a few hundred, of different lengths, the
    /// empty one too) of both, checking after each that they agree and the invariants hold.
    fn run(t: &mut Top, model: &mut Model, rng: &mut Rng, steps: u64) {
        for _ in 0..steps {
            let r = rng.next();
            let id = if r.is_multiple_of(4) {
                r / 4 % 8
            } else {
                r / 4 % 301
            };
            let key = if id == 300 {
                Vec::new()
            } else {
                format!("k{id}").into_bytes()
            };
            let command = COMMANDS[(r >> 40) as usize % COMMANDS.len()];
            // Several denials in one millisecond, so the times tie and only the order counted
            // breaks ties between the fewest counted.
            let now_ms = (model.step / 3) as i64;
            t.denied(&key, command, now_ms);
            model.denied(&key, command, now_ms);
            t.check();
            assert_eq!(
                t.heaviest(usize::MAX),
                model.heaviest(),
                "step {}",
                model.step
            );
        }
    }

    #[test]
    fn agrees_with_a_plain_space_saving_model() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for slots in [1, 2, 4, 7, 50] {
            let mut t = Top::new(slots);
            let mut model = Model::new(slots);
            run(&mut t, &mut model, &mut rng, 20_000);
            let top = t.heaviest(usize::MAX);
            assert_eq!(top.len(), slots);
            assert!(
                top.iter().any(|e| e.error > 0),
                "{slots}: nothing was replaced"
            );
        }
    }

    #[test]
    fn a_warm_table_denies_new_keys_without_reallocating() {
        let mut t = Top::new(16);
        let mut rng = Rng(42);
        let mut fresh = 0u64;
        let mut deny_new = |t: &mut Top| {
            t.denied(format!("key:{fresh:08}").as_bytes(), c"RL.GCRA", 0);
            fresh += 1;
        };
        for _ in 0..1_000 {
            deny_new(&mut t);
        }
        let buffers = |t: &Top| -> Vec<(*const u8, usize)> {
            t.entries
                .iter()
                .map(|s| (s.entry.key.as_ptr(), s.entry.key.capacity()))
                .collect()
        };
        let pools = |t: &Top| {
            (
                t.entries.as_ptr(),
                t.entries.capacity(),
                t.buckets.as_ptr(),
                t.buckets.capacity(),
                t.index.as_ptr(),
                t.index.len(),
            )
        };
        let (warm, warm_pools) = (buffers(&t), pools(&t));
        assert_eq!(warm.len(), 16);
        let before: Vec<Entry> = t.heaviest(16);
        for i in 0..20_000u32 {
            deny_new(&mut t);
            // Tracked keys counted again now and then, so buckets come and go.
            if i.is_multiple_of(3) {
                let key = t.entries[(rng.next() % 16) as usize].entry.key.clone();
                t.denied(&key, c"RL.GCRA", 0);
            }
            assert_eq!(buffers(&t), warm, "a key buffer moved or grew");
            assert_eq!(pools(&t), warm_pools, "a pool moved or grew");
        }
        t.check();
        let after = t.heaviest(16);
        assert!(after.iter().all(|e| !before.iter().any(|b| b.key == e.key)));
    }

    #[test]
    fn resizing_down_up_and_off_keeps_agreeing_with_the_model() {
        let mut rng = Rng(7);
        let mut t = Top::new(7);
        let mut model = Model::new(7);
        run(&mut t, &mut model, &mut rng, 3_000);
        for slots in [3, 3, 1, 50, 2, 0, 0, 7, 50, 4] {
            let kept = t.heaviest(slots);
            t.resize(slots);
            model.resize(slots);
            t.check();
            assert_eq!(t.slots(), slots);
            assert_eq!(t.heaviest(usize::MAX), kept, "resize to {slots}");
            assert_eq!(t.heaviest(usize::MAX), model.heaviest());
            run(&mut t, &mut model, &mut rng, 2_000);
            if slots == 0 {
                assert!(t.heaviest(usize::MAX).is_empty());
            }
        }
        t.reset();
        t.check();
        assert!(t.heaviest(usize::MAX).is_empty());
        assert_eq!(t.slots(), 4);
    }
}
