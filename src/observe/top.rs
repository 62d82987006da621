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
//! - **Slots** hold the tracked keys, each with its name kept in the slot itself (at most
//!   `KEY_BYTES` of it), its 64-bit hash and its place in its bucket's list.
//! - **Buckets** group the slots with the same count. They form a doubly linked list ordered by
//!   count, from the `lowest` to the `highest`; each keeps a doubly linked list of its slots,
//!   least recently counted first: a slot joins a bucket at the tail, and the slot replaced is
//!   the head of the lowest bucket. Counting a slot once more moves it to the next bucket if that
//!   one counts exactly one more, else to a new bucket right after (or, alone in its bucket, just
//!   bumps the bucket's count). Emptied buckets go to a free list and are reused.
//! - **The index** is an open-addressing table of slot numbers (linear probing, at most a
//!   quarter full, deletion by backward shift), hashed with a per-`Top` seeded multiply-and-fold hash,
//!   so key names cannot be chosen to make probe sequences long. The slot of the latest denial
//!   is checked first: a key denied again right away is found without hashing.
//!
//! So each denial is O(1) worst case: at most one hash of the key, a short probe, and a constant number
//! of list updates. Every pool is reserved for the number of slots when it is set, and a slot
//! holds its key name itself, so a denial never allocates: the memory is fixed by the number of
//! slots (`bytes`), however many keys exist and however long their names are.
//!
//! A key name longer than `KEY_BYTES` is kept as its first `KEY_BYTES` bytes, and told apart from
//! other keys with the same ones by its length and its hash (64 bits, seeded when the module
//! loads, so a name cannot be chosen to collide); it is listed as those bytes, `...` and the hash
//! in 16 hex digits.
//!
//! The lists' order is `RL.TOP`'s: buckets from the highest count down, each from the most
//! recently counted slot, so listing `n` keys costs O(n) and resizing O(S) for S slots, with no
//! sorting.

use std::collections::hash_map::RandomState;
use std::ffi::CStr;
use std::hash::BuildHasher;

/// The bytes of a key name a slot keeps.
pub const KEY_BYTES: usize = 64;

/// The longest name listed: a long key's first `KEY_BYTES` bytes, `...` and 16 hex digits.
pub const SHOWN_BYTES: usize = KEY_BYTES + 3 + 16;

/// One tracked key, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key's name, or for a name longer than `KEY_BYTES`: its first `KEY_BYTES` bytes, `...`
    /// and its hash in 16 hex digits.
    pub key: Vec<u8>,
    /// The key's database: one name in two databases is two keys, tracked apart.
    pub db: i64,
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
/// `NONE`, and the index's size (four times this) fits the `u32` arithmetic.
const MAX_SLOTS: usize = 1 << 28;

/// The fewest places in the index (when there is one).
const MIN_INDEX: usize = 8;

/// A tracked key: its name (or the first `KEY_BYTES` of it), length and hash, its counts and
/// times (`denied` is always its bucket's count), and its links. Plain data: no heap.
#[derive(Debug, Clone, Copy)]
struct Slot {
    name: [u8; KEY_BYTES],
    /// The key's whole length (at most 512 MiB, the server's largest string).
    len: u32,
    db: i32,
    /// The hash of the name and the database.
    hash: u64,
    denied: u64,
    error: u64,
    command: &'static CStr,
    first_denied_ms: i64,
    last_denied_ms: i64,
    bucket: u32,
    /// The slot counted just before (toward the head) and just after (toward the tail) in the
    /// same bucket.
    prev: u32,
    next: u32,
}

/// The first bytes of a key a slot keeps.
fn kept_part(key: &[u8]) -> &[u8] {
    key.get(..KEY_BYTES).unwrap_or(key)
}

impl Slot {
    fn new(key: &[u8], db: i32, hash: u64, command: &'static CStr, now_ms: i64) -> Slot {
        let mut slot = Slot {
            name: [0; KEY_BYTES],
            len: 0,
            db,
            hash,
            denied: 1,
            error: 0,
            command,
            first_denied_ms: now_ms,
            last_denied_ms: now_ms,
            bucket: NONE,
            prev: NONE,
            next: NONE,
        };
        slot.set_key(key, db, hash);
        slot
    }

    fn set_key(&mut self, key: &[u8], db: i32, hash: u64) {
        let kept = kept_part(key);
        if let Some(name) = self.name.get_mut(..kept.len()) {
            name.copy_from_slice(kept);
        }
        self.len = u32::try_from(key.len()).unwrap_or(u32::MAX);
        self.db = db;
        self.hash = hash;
    }

    /// The bytes of the name it keeps.
    fn kept(&self) -> &[u8] {
        self.name.get(..self.len as usize).unwrap_or(&self.name)
    }

    /// Whether it tracks the key of this hash, database, length and first bytes.
    fn holds(&self, hash: u64, db: i32, len: usize, kept: &[u8]) -> bool {
        self.hash == hash && self.db == db && self.len as usize == len && self.kept() == kept
    }

    /// Whether it tracks `key` of `db`, known without its hash: a key no longer than `KEY_BYTES`.
    fn holds_short(&self, key: &[u8], db: i32) -> bool {
        key.len() <= KEY_BYTES
            && self.db == db
            && self.len as usize == key.len()
            && self.kept() == key
    }

    /// The name as listed, written into `buf`.
    fn shown<'a>(&'a self, buf: &'a mut [u8; SHOWN_BYTES]) -> &'a [u8] {
        if self.len as usize <= KEY_BYTES {
            return self.kept();
        }
        shown_long(&self.name, self.hash, buf)
    }

    fn entry(&self) -> Entry {
        let mut buf = [0u8; SHOWN_BYTES];
        Entry {
            key: self.shown(&mut buf).to_vec(),
            db: i64::from(self.db),
            denied: self.denied,
            error: self.error,
            command: self.command,
            first_denied_ms: self.first_denied_ms,
            last_denied_ms: self.last_denied_ms,
        }
    }
}

/// A long key as listed: its first `KEY_BYTES` bytes, `...`, its hash in 16 hex digits.
fn shown_long<'a>(kept: &[u8; KEY_BYTES], hash: u64, buf: &'a mut [u8; SHOWN_BYTES]) -> &'a [u8] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let (name, rest) = buf.split_at_mut(KEY_BYTES);
    name.copy_from_slice(kept);
    let (dots, digits) = rest.split_at_mut(3);
    dots.copy_from_slice(b"...");
    for (i, d) in digits.iter_mut().enumerate() {
        let nibble = (hash >> (60 - 4 * i)) & 0xf;
        *d = HEX.get(nibble as usize).copied().unwrap_or(b'0');
    }
    buf
}

/// The slots with one count.
#[derive(Debug, Clone, Copy)]
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
    /// The buckets with the fewest and the most denials.
    lowest: u32,
    highest: u32,
    /// Slot numbers (or `NONE`), a power of two long, at least four times the slots (none when
    /// nothing is tracked).
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

/// Places in the index for `tracked` slots: none for none, else a power of two at least four
/// times as many.
fn index_places(tracked: usize) -> usize {
    if tracked == 0 {
        0
    } else {
        tracked.saturating_mul(4).next_power_of_two().max(MIN_INDEX)
    }
}

/// Puts slot `s` at the first empty place of `index` from its hash's.
fn index_put(index: &mut [u32], mask: usize, s: u32, hash: u64) {
    let mut place = hash as usize & mask;
    for _ in 0..index.len() {
        match index.get_mut(place) {
            Some(p) if *p == NONE => {
                *p = s;
                return;
            }
            Some(_) => place = (place + 1) & mask,
            None => return,
        }
    }
}

impl Top {
    pub fn new(slots: usize) -> Top {
        Top::with_hasher(slots, KeyHasher::new())
    }

    fn with_hasher(slots: usize, hasher: KeyHasher) -> Top {
        let tracked = slots.min(MAX_SLOTS);
        Top {
            slots,
            entries: Vec::with_capacity(tracked),
            buckets: Vec::with_capacity(tracked),
            free: NONE,
            lowest: NONE,
            highest: NONE,
            index: vec![NONE; index_places(tracked)],
            hasher,
            last: NONE,
        }
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    /// How many keys it tracks now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The bytes its pools take (reserved when the number of slots is set; the allocator may
    /// round each of its three blocks up).
    pub fn bytes(&self) -> usize {
        self.entries.capacity() * size_of::<Slot>()
            + self.buckets.capacity() * size_of::<Bucket>()
            + self.index.capacity() * size_of::<u32>()
    }

    /// The bytes a `Top` of `slots` slots takes, by the same count as `bytes`.
    pub fn bytes_for(slots: usize) -> usize {
        let tracked = slots.min(MAX_SLOTS);
        tracked * (size_of::<Slot>() + size_of::<Bucket>())
            + index_places(tracked) * size_of::<u32>()
    }

    /// How many keys it tracks at most.
    fn tracked(&self) -> usize {
        self.slots.min(MAX_SLOTS)
    }

    /// One denial of `key` in database `db` by `command` at `now_ms`. The latest denied key is
    /// checked first, in the caller (a flood of denials is mostly one key); any other goes
    /// through the index.
    #[inline(always)]
    pub fn denied(&mut self, key: &[u8], db: i32, command: &'static CStr, now_ms: i64) {
        if self.tracked() == 0 {
            return;
        }
        let last = self.last;
        if let Some(slot) = self.slot_mut(last)
            && slot.holds_short(key, db)
        {
            slot.command = command;
            slot.last_denied_ms = now_ms;
            self.count(last);
            return;
        }
        self.denied_other(key, db, command, now_ms);
    }

    /// `denied` for a key other than the latest.
    #[inline(never)]
    fn denied_other(&mut self, key: &[u8], db: i32, command: &'static CStr, now_ms: i64) {
        let hash = self.hasher.hash_in(key, db);
        let place = match self.find(hash, db, key.len(), kept_part(key)) {
            Ok(s) => {
                self.last = s;
                if let Some(slot) = self.slot_mut(s) {
                    slot.command = command;
                    slot.last_denied_ms = now_ms;
                }
                self.count(s);
                return;
            }
            Err(place) => place,
        };
        if self.entries.len() < self.tracked() {
            let s = self.entries.len() as u32;
            self.entries.push(Slot::new(key, db, hash, command, now_ms));
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
            slot.set_key(key, db, hash);
            slot.denied = fewest;
            slot.error = fewest;
            slot.command = command;
            slot.first_denied_ms = now_ms;
            slot.last_denied_ms = now_ms;
        }
        self.index_insert(s, hash);
        self.last = s;
        self.count(s);
    }

    /// The `count` most-denied keys, most first; among equal counts the most recently counted
    /// first.
    pub fn heaviest(&self, count: usize) -> Vec<Entry> {
        self.pick(count)
            .iter()
            .filter_map(|&s| self.slot(s))
            .map(Slot::entry)
            .collect()
    }

    /// The slots of the `count` most-denied keys in `RL.TOP`'s order, which is the lists' own:
    /// buckets from the highest down, each from its tail (most recently counted) to its head.
    /// O(count).
    fn pick(&self, count: usize) -> Vec<u32> {
        let mut picked: Vec<u32> = Vec::with_capacity(count.min(self.entries.len()));
        let mut b = self.highest;
        while let Some(bucket) = self.bucket(b) {
            let mut s = bucket.tail;
            while let Some(slot) = self.slot(s) {
                if picked.len() >= count {
                    return picked;
                }
                picked.push(s);
                s = slot.prev;
            }
            b = bucket.prev;
        }
        picked
    }

    /// Forgets every key (the hash's seed stays, so a long key keeps the digits it is listed
    /// with).
    pub fn reset(&mut self) {
        *self = Top::with_hasher(self.slots, self.hasher.clone());
    }

    /// A new number of slots: the heaviest keys are kept (0 turns tracking off and frees every
    /// pool), with their counts, errors and times, and in the same order among equal counts.
    /// O(S) and no sorting: the kept slots stay where they are or fill the places of dropped
    /// ones, and the buckets are rebuilt from the lists' order.
    pub fn resize(&mut self, slots: usize) {
        let tracked = slots.min(MAX_SLOTS);
        self.slots = slots;
        if tracked == 0 {
            *self = Top::with_hasher(slots, self.hasher.clone());
            return;
        }
        if tracked < self.entries.len() {
            self.drop_lightest(tracked);
        }
        // The pools, reserved for the new number of slots.
        if tracked > self.entries.capacity() {
            self.entries.reserve_exact(tracked - self.entries.len());
            self.buckets
                .reserve_exact(tracked.saturating_sub(self.buckets.len()));
        } else {
            self.entries.shrink_to(tracked);
            self.buckets.shrink_to(tracked);
        }
        let places = index_places(tracked);
        if places != self.index.len() {
            self.index = vec![NONE; places];
        } else {
            self.index.fill(NONE);
        }
        let mask = self.mask();
        for (s, slot) in self.entries.iter().enumerate() {
            index_put(&mut self.index, mask, s as u32, slot.hash);
        }
    }

    /// Keeps the `keep` heaviest slots (fewer than there are), moved into `0..keep`, their
    /// buckets rebuilt in the same order.
    fn drop_lightest(&mut self, keep: usize) {
        let len = self.entries.len();
        // Heaviest first.
        let picked = self.pick(keep);
        let mut kept = vec![false; len];
        for &s in &picked {
            if let Some(k) = kept.get_mut(s as usize) {
                *k = true;
            }
        }
        // Kept slots past `keep` move into the places of dropped ones below it.
        let mut hole = 0usize;
        let mut moved: Vec<(u32, u32)> = Vec::new();
        for from in keep..len {
            if kept.get(from) != Some(&true) {
                continue;
            }
            while kept.get(hole) == Some(&true) {
                hole += 1;
            }
            if let Some(slot) = self.entries.get(from).copied()
                && let Some(place) = self.entries.get_mut(hole)
            {
                *place = slot;
                moved.push((from as u32, hole as u32));
            }
            hole += 1;
        }
        self.entries.truncate(keep);
        self.buckets.clear();
        self.free = NONE;
        self.lowest = NONE;
        self.highest = NONE;
        self.last = NONE;
        // `moved` is in increasing order of the old place: found by binary search.
        let place_of = |old: u32| match moved.binary_search_by_key(&old, |&(from, _)| from) {
            Ok(i) => moved.get(i).map_or(NONE, |&(_, to)| to),
            Err(_) => old,
        };
        // Lightest first: each slot joins the tail of the highest bucket so far, or a new one.
        for &old in picked.iter().rev() {
            let s = place_of(old);
            let Some(count) = self.slot(s).map(|slot| slot.denied) else {
                continue;
            };
            let b = match self.bucket(self.highest) {
                Some(h) if h.count == count => self.highest,
                _ => self.new_bucket(count, self.highest, NONE),
            };
            self.append(s, b);
        }
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

    /// The slot tracking the key of this hash, length and first bytes, or else the empty place
    /// where it would go (past the end if the index had none, which its size rules out).
    fn find(&self, hash: u64, db: i32, len: usize, kept: &[u8]) -> Result<u32, usize> {
        let mask = self.mask();
        let mut place = hash as usize & mask;
        for _ in 0..self.index.len() {
            let s = self.index.get(place).copied().unwrap_or(NONE);
            if s == NONE {
                return Err(place);
            }
            if self
                .slot(s)
                .is_some_and(|slot| slot.holds(hash, db, len, kept))
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
        index_put(&mut self.index, mask, s, hash);
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
        match self.bucket_mut(next) {
            Some(n) => n.prev = b,
            None => self.highest = b,
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
            slot.denied = count;
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
        match self.bucket_mut(next) {
            Some(n) => n.prev = prev,
            None => self.highest = prev,
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
                    slot.denied = more;
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
                assert_eq!(slot.denied, bucket.count, "slot {s}'s count");
                (prev_s, s) = (s, slot.next);
            }
            assert_eq!(bucket.tail, prev_s, "bucket {b}'s tail");
            live += 1;
            assert!(live <= self.buckets.len(), "bucket list loops");
            (prev_b, prev_count, b) = (b, bucket.count, bucket.next);
        }
        assert_eq!(self.highest, prev_b, "the highest bucket");
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
        assert_eq!(places, index_places(tracked));
        assert_eq!(self.bytes(), Top::bytes_for(self.slots));
        assert_eq!(self.index.iter().filter(|&&s| s != NONE).count(), n);
        for (i, slot) in self.entries.iter().enumerate() {
            if slot.len as usize <= KEY_BYTES {
                assert_eq!(
                    slot.hash,
                    self.hasher.hash_in(slot.kept(), slot.db),
                    "slot {i}'s hash"
                );
            }
            assert_eq!(
                self.find(slot.hash, slot.db, slot.len as usize, slot.kept()),
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

    /// The hash of a key name in a database: the name's own in database 0, else the name's mixed
    /// with the database's number under the seed.
    fn hash_in(&self, key: &[u8], db: i32) -> u64 {
        let h = self.hash(key);
        if db == 0 {
            return h;
        }
        fold(
            h ^ u64::from(db as u32).wrapping_mul(MIX[1]),
            self.seed[0] | 1,
        )
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
            t.denied(k.as_bytes(), 0, c"RL.GCRA", 1000 + i as i64);
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
            t.denied(k.as_bytes(), 0, c"RL.ALL", 5);
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
                t.denied(&light, 0, c"RL.TOKENBUCKET", 0);
                *truth.entry(light.clone()).or_default() += 1;
                n += 1;
            }
            if round % 10 == 0 {
                let heavy = format!("heavy:{}", round % 50 / 10).into_bytes();
                for _ in 0..5 {
                    t.denied(&heavy, 0, c"RL.TOKENBUCKET", 0);
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
            t.denied(k.as_bytes(), 0, c"RL.GCRA", 1);
        }
        t.resize(2);
        t.check();
        let keys: Vec<Vec<u8>> = t.heaviest(9).into_iter().map(|e| e.key.to_vec()).collect();
        assert_eq!(keys, [b"a".to_vec(), b"b".to_vec()]);
        t.denied(b"a", 0, c"RL.GCRA", 2);
        assert_eq!(t.heaviest(1)[0].denied, 4);
        t.resize(0);
        t.denied(b"a", 0, c"RL.GCRA", 3);
        assert!(t.heaviest(9).is_empty());
        t.resize(2);
        t.denied(b"z", 0, c"RL.GCRA", 4);
        t.reset();
        t.check();
        assert!(t.heaviest(9).is_empty());
        assert_eq!(t.slots(), 2);
    }

    /// Space-Saving written plainly: a list of entries, each with the key's whole name and the
    /// step it was last counted at; the one replaced has the fewest denials, then the oldest
    /// step. Entries carry the names as listed (a long one through the same seeded hash).
    struct Model {
        slots: usize,
        step: u64,
        hasher: KeyHasher,
        entries: Vec<((Vec<u8>, i32), Entry, u64)>,
    }

    /// A name as `RL.TOP` lists it.
    fn shown(hasher: &KeyHasher, key: &[u8], db: i32) -> Vec<u8> {
        match key.first_chunk::<KEY_BYTES>() {
            Some(kept) if key.len() > KEY_BYTES => {
                let mut buf = [0u8; SHOWN_BYTES];
                shown_long(kept, hasher.hash_in(key, db), &mut buf).to_vec()
            }
            _ => key.to_vec(),
        }
    }

    impl Model {
        fn new(slots: usize, t: &Top) -> Model {
            Model {
                slots,
                step: 0,
                hasher: t.hasher.clone(),
                entries: Vec::new(),
            }
        }

        fn denied(&mut self, key: &[u8], db: i32, command: &'static CStr, now_ms: i64) {
            self.step += 1;
            if self.slots == 0 {
                return;
            }
            if let Some((_, e, at)) = self
                .entries
                .iter_mut()
                .find(|((k, d), ..)| k == key && *d == db)
            {
                e.denied += 1;
                e.command = command;
                e.last_denied_ms = now_ms;
                *at = self.step;
                return;
            }
            let fresh = Entry {
                key: shown(&self.hasher, key, db),
                db: i64::from(db),
                denied: 1,
                error: 0,
                command,
                first_denied_ms: now_ms,
                last_denied_ms: now_ms,
            };
            if self.entries.len() < self.slots {
                self.entries.push(((key.to_vec(), db), fresh, self.step));
                return;
            }
            let (k, e, at) = self
                .entries
                .iter_mut()
                .min_by_key(|(_, e, at)| (e.denied, *at))
                .unwrap();
            *k = (key.to_vec(), db);
            *e = Entry {
                denied: e.denied + 1,
                error: e.denied,
                ..fresh
            };
            *at = self.step;
        }

        /// `RL.TOP`'s order: the most denied first, then the most recently counted.
        fn sort(&mut self) {
            self.entries
                .sort_by(|(_, a, at_a), (_, b, at_b)| b.denied.cmp(&a.denied).then(at_b.cmp(at_a)));
        }

        fn resize(&mut self, slots: usize) {
            self.sort();
            self.entries.truncate(slots);
            self.slots = slots;
        }

        fn heaviest(&mut self) -> Vec<Entry> {
            self.sort();
            self.entries.iter().map(|(_, e, _)| e.clone()).collect()
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
            // Some names longer than a slot keeps: the same first bytes, told apart by their
            // length or only by their hash.
            let key = if id == 300 {
                Vec::new()
            } else if id % 5 == 0 {
                format!("{}{id}", "long:".repeat(id as usize % 3 + 13)).into_bytes()
            } else {
                format!("k{id}").into_bytes()
            };
            let command = COMMANDS[(r >> 40) as usize % COMMANDS.len()];
            // Several denials in one millisecond, so the times tie and only the order counted
            // breaks ties between the fewest counted.
            let now_ms = (model.step / 3) as i64;
            // The same names in three databases: each pair of name and database is its own key.
            let db = (r >> 50) as i32 % 3;
            t.denied(&key, db, command, now_ms);
            model.denied(&key, db, command, now_ms);
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
            let mut model = Model::new(slots, &t);
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
    fn a_table_denies_new_keys_of_any_length_without_allocating() {
        let mut t = Top::new(16);
        let mut rng = Rng(42);
        let mut fresh = 0u64;
        // Names of 9 to 8,200 bytes.
        let mut deny_new = |t: &mut Top| {
            let name = format!("key:{fresh:08}").repeat(1 + (fresh % 7 * 90) as usize);
            t.denied(name.as_bytes(), 0, c"RL.GCRA", 0);
            fresh += 1;
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
        let empty = pools(&t);
        let bytes = t.bytes();
        for i in 0..20_000u32 {
            deny_new(&mut t);
            // Tracked keys counted again now and then, so buckets come and go.
            if i.is_multiple_of(3) {
                let slot = t.entries[(rng.next() % t.entries.len() as u64) as usize];
                if slot.len as usize <= KEY_BYTES {
                    t.denied(slot.kept(), 0, c"RL.GCRA", 0);
                }
            }
            assert_eq!(pools(&t), empty, "a pool moved or grew");
            assert_eq!(t.bytes(), bytes);
        }
        t.check();
        assert_eq!(t.len(), 16);
    }

    #[test]
    fn a_long_name_is_kept_as_its_first_bytes_and_listed_with_its_hash() {
        let mut t = Top::new(4);
        let head = "tenant:".repeat(10);
        let (a, b) = (
            format!("{head}{}", "a".repeat(8000)),
            format!("{head}{}", "b".repeat(8000)),
        );
        for _ in 0..3 {
            t.denied(a.as_bytes(), 0, c"RL.GCRA", 1);
        }
        t.denied(b.as_bytes(), 0, c"RL.GCRA", 2);
        // A name of exactly the bytes a slot keeps is listed whole.
        let exact = "e".repeat(KEY_BYTES);
        t.denied(exact.as_bytes(), 0, c"RL.GCRA", 3);
        t.check();
        let listed = t.heaviest(9);
        let names: Vec<String> = listed
            .iter()
            .map(|e| String::from_utf8(e.key.clone()).unwrap())
            .collect();
        let hex = |key: &str| format!("{:016x}", t.hasher.hash(key.as_bytes()));
        let kept = &head[..KEY_BYTES];
        assert_eq!(
            names,
            [
                format!("{kept}...{}", hex(&a)),
                exact.clone(),
                format!("{kept}...{}", hex(&b)),
            ]
        );
        assert_eq!(listed[0].denied, 3);
        assert_eq!(names[0].len(), SHOWN_BYTES);
        // The digits stay across a reset.
        t.reset();
        t.denied(a.as_bytes(), 0, c"RL.GCRA", 4);
        assert_eq!(t.heaviest(1)[0].key, names[0].as_bytes());
        // The same first bytes and hash but another length is another key.
        assert_ne!(
            t.find(t.hasher.hash(a.as_bytes()), 0, a.len() + 1, kept.as_bytes()),
            Ok(0)
        );
        assert_eq!(
            t.find(t.hasher.hash(a.as_bytes()), 0, a.len(), kept.as_bytes()),
            Ok(0)
        );
    }

    #[test]
    fn the_memory_is_set_by_the_slots_and_freed_at_zero() {
        assert_eq!(Top::bytes_for(0), 0);
        assert_eq!(Top::new(0).bytes(), 0);
        let slot = size_of::<Slot>() + size_of::<Bucket>();
        assert_eq!(Top::bytes_for(128), 128 * slot + 512 * 4);
        assert_eq!(Top::bytes_for(100_000), 100_000 * slot + 524_288 * 4);
        let mut t = Top::new(1000);
        let before = t.bytes();
        for i in 0..3000 {
            t.denied(format!("{i}").repeat(3000).as_bytes(), 0, c"RL.ALL", i);
        }
        assert_eq!(t.bytes(), before);
        t.resize(10);
        assert_eq!(t.bytes(), Top::bytes_for(10));
        t.check();
        t.resize(0);
        assert_eq!(t.bytes(), 0);
        assert!(t.heaviest(10).is_empty());
    }

    #[test]
    fn listing_a_few_of_one_large_tie_orders_them_fully() {
        let mut t = Top::new(1000);
        let mut model = Model::new(1000, &t);
        for i in 0..1000u32 {
            // Ten distinct times, a hundred names each, in no order.
            let key = format!("{:04}", (i * 7919) % 1000).into_bytes();
            let now = i64::from(i % 10);
            t.denied(&key, 0, c"RL.GCRA", now);
            model.denied(&key, 0, c"RL.GCRA", now);
        }
        for count in [1, 7, 100, 150, 999, 1000, 5000] {
            let want: Vec<Entry> = model.heaviest().into_iter().take(count).collect();
            assert_eq!(t.heaviest(count), want, "{count}");
        }
    }

    #[test]
    fn resizing_down_up_and_off_keeps_agreeing_with_the_model() {
        let mut rng = Rng(7);
        let mut t = Top::new(7);
        let mut model = Model::new(7, &t);
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
