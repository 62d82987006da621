#![allow(dead_code)]
//! One key of an in-memory keyspace for the fuzz targets: empty, a string, a hash (release 0.1's
//! layout) or a sorted set in Redis order, with an expiry; a `Store` that reads it as the Redis
//! binding reads a key and applies every `Effect` as the replicated commands would.

use std::collections::BTreeMap;

use redis_rate_limiter::codec::error::{ErrorReply, WRONGTYPE};
use redis_rate_limiter::store::{Effect, EntryVisitor, FieldName, Slot, Store, member_name};

#[derive(Debug, Default, Clone, PartialEq)]
pub enum Value {
    #[default]
    Empty,
    Str(Vec<u8>),
    Hash(BTreeMap<Vec<u8>, Vec<u8>>),
    /// Entries in Redis order: score, then member bytes.
    Zset(Vec<(f64, Vec<u8>)>),
}

#[derive(Debug, Default, Clone, PartialEq)]
pub struct Key {
    pub value: Value,
    pub expire_at_ms: Option<i64>,
}

impl Key {
    /// The entries of a sorted set (none for any other value).
    pub fn entries(&self) -> &[(f64, Vec<u8>)] {
        match &self.value {
            Value::Zset(z) => z,
            _ => &[],
        }
    }

    /// Adds or moves an entry (`ZADD`), making the key a sorted set if it was empty.
    pub fn zadd(&mut self, score: f64, member: &[u8]) {
        if self.value == Value::Empty {
            self.value = Value::Zset(Vec::new());
        }
        if let Value::Zset(z) = &mut self.value {
            z.retain(|(_, m)| m != member);
            z.push((score, member.to_vec()));
            z.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        }
    }

    /// `ZREMRANGEBYRANK key from to` on the sorted set's ranks, as Redis counts them (negative
    /// from the end); the key goes when it is left empty.
    fn remove_ranks(&mut self, from: i64, to: i64) {
        if let Value::Zset(z) = &mut self.value {
            let len = z.len() as i64;
            let at = |r: i64| if r < 0 { (len + r).max(0) } else { r.min(len) };
            let (from, to) = (at(from), (at(to) + 1).min(len));
            if from < to {
                z.drain(from as usize..to as usize);
            }
            if z.is_empty() {
                *self = Key::default();
            }
        }
    }

    fn zset_mut(&mut self) -> Result<&mut Vec<(f64, Vec<u8>)>, ErrorReply> {
        if self.value == Value::Empty {
            self.value = Value::Zset(Vec::new());
        }
        match &mut self.value {
            Value::Zset(z) => Ok(z),
            _ => Err(WRONGTYPE),
        }
    }
}

impl Store for Key {
    fn read(&self) -> Result<Slot<'_>, ErrorReply> {
        Ok(match &self.value {
            Value::Empty => Slot::Empty,
            Value::Str(v) => Slot::Value(v),
            Value::Hash(_) => Slot::Hash,
            Value::Zset(_) => Slot::Zset,
        })
    }

    fn legacy_fields(
        &self,
        names: &[&'static FieldName],
        out: &mut [Option<Vec<u8>>],
    ) -> Result<(), ErrorReply> {
        if let Value::Hash(h) = &self.value {
            for (slot, name) in out.iter_mut().zip(names) {
                *slot = h.get(name.name.to_bytes()).cloned();
            }
        }
        Ok(())
    }

    fn zset_len(&self) -> Result<i64, ErrorReply> {
        Ok(self.entries().len() as i64)
    }

    fn zset_count(&self, min: f64, min_inclusive: bool, max: f64) -> Result<i64, ErrorReply> {
        let inside = |s: f64| (if min_inclusive { s >= min } else { s > min }) && s <= max;
        Ok(self.entries().iter().filter(|(s, _)| inside(*s)).count() as i64)
    }

    fn zset_from_last(&self, rank: i64, visit: &mut EntryVisitor<'_>) -> Result<bool, ErrorReply> {
        let z = self.entries();
        let i = z.len() as i64 - 1 - rank;
        match usize::try_from(i).ok().and_then(|i| z.get(i)) {
            Some((score, member)) if rank >= 0 => {
                visit(member, *score)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn zset_score(&self, member: &[u8]) -> Result<Option<f64>, ErrorReply> {
        Ok(self.entries().iter().find(|(_, m)| m == member).map(|(s, _)| *s))
    }

    fn zset_first(&self, count: i64, visit: &mut EntryVisitor<'_>) -> Result<(), ErrorReply> {
        for (score, member) in self.entries().iter().take(usize::try_from(count).unwrap_or(0)) {
            visit(member, *score)?;
        }
        Ok(())
    }

    fn hash_len(&self) -> Result<i64, ErrorReply> {
        Ok(match &self.value {
            Value::Hash(h) => h.len() as i64,
            _ => 0,
        })
    }

    fn has_expiry(&self) -> Result<bool, ErrorReply> {
        Ok(self.expire_at_ms.is_some())
    }

    fn writable(&self) -> Result<(), ErrorReply> {
        Ok(())
    }

    fn apply(&mut self, effect: &Effect<'_>) -> Result<(), ErrorReply> {
        match effect {
            Effect::Set {
                value,
                expire_at_ms,
            } => {
                self.value = Value::Str(value.to_vec());
                self.expire_at_ms = Some(*expire_at_ms);
            }
            Effect::Append {
                entries,
                expire_at_ms,
            } => {
                self.zset_mut()?;
                if entries.trim > 0 {
                    self.remove_ranks(0, entries.trim - 1);
                }
                let mut name = Vec::new();
                for i in entries.first_index..entries.first_index + entries.count {
                    member_name(entries.score, i, &mut name);
                    self.zadd(entries.score, &name);
                }
                self.expire_at_ms = Some(*expire_at_ms);
            }
            Effect::Pop {
                trim,
                count,
                expire_at_ms,
            } => {
                self.zset_mut()?;
                if *trim > 0 {
                    self.remove_ranks(0, trim - 1);
                }
                if *count > 0 {
                    self.remove_ranks(-count, -1);
                }
                if let (Some(at), Value::Zset(_)) = (expire_at_ms, &self.value) {
                    self.expire_at_ms = Some(*at);
                }
            }
            Effect::Lease {
                trim,
                id,
                expiry,
                expire_at_ms,
            } => {
                self.zset_mut()?;
                if *trim > 0 {
                    self.remove_ranks(0, trim - 1);
                }
                match expiry {
                    Some(e) => self.zadd(*e, id),
                    None => {
                        if let Value::Zset(z) = &mut self.value {
                            z.retain(|(_, m)| m != id);
                            if z.is_empty() {
                                *self = Key::default();
                            }
                        }
                    }
                }
                if let (Some(at), Value::Zset(_)) = (expire_at_ms, &self.value) {
                    self.expire_at_ms = Some(*at);
                }
            }
        }
        Ok(())
    }
}
