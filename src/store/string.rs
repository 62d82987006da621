//! The pipeline of every limiter whose state is a few numbers in one string, over `Store`.
//!
//! load (one string, or a hash of the earlier layout) -> decode -> decide -> encode -> store one
//! string with its expiry.
//!
//! The stored value is the state's numbers in a fixed order (a limiter's `FIELDS`), each written
//! as C's `%.17g`, separated by one space: `"4.5 1700000000123456"`. The Lua twins write the same
//! bytes with `string.format('%.17g', x)`, which is C's on every server. Release 0.1 kept the
//! same numbers in a hash, one field per name; such a key is still read, and its next write
//! replaces it with the string.

use std::convert::Infallible;

use crate::codec::args::{UPTO_ARG, split_upto, with_last};
use crate::codec::error::{ErrorReply, WRONGTYPE};
use crate::codec::number::{G17_MAX_LEN, format_g17};
use crate::codec::owner::Owned;
use crate::codec::remembered::{self, Remembered};
use crate::core::{Operation, Reply};
use crate::store::kind::{self, FOREIGN_HASH, Kind};
use crate::store::{Effect, FieldName, Limit, OpenStore, Request, Slot, Store, grant};

/// New state (in `FIELDS` order) and the key's absolute expiry in Unix milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FieldsWrite<const N: usize> {
    pub values: [f64; N],
    pub expire_at_ms: i64,
}

/// One limiter command whose state is `N` numbers.
pub trait FieldsLimiter<const N: usize> {
    type Params: Copy + 'static;
    type State: Copy;

    /// The reply to a call with too few or too many arguments.
    const ARITY_ERROR: ErrorReply;

    /// How many parameters come between the key and the cost (`UPTO n` follows exactly these).
    const PARAMS: usize;

    /// The kind of state it writes: its tag is the first word of the stored value.
    const KIND: Kind;

    /// Names of the numbers, in the order `decode` reads them and `FieldsWrite::values` stores
    /// them (and the field names of the earlier hash layout).
    const FIELDS: [&'static FieldName; N];

    /// Arguments after the key.
    fn parse(args: &[&[u8]]) -> Result<Request<Self::Params>, ErrorReply>;
    /// The last arguments this limiter parsed, and their request (`parse` below gives it again
    /// for the same bytes): a static `Remembered` of its command file, kept by the main thread.
    fn remembered() -> &'static Owned<Remembered<Request<Self::Params>>>;
    /// The stored numbers of an existing key (absent ones are `None`), as a call with these
    /// parameters at `now_us` reads them: a number no call of this limiter could have written
    /// (a time ahead of now by more than `codec::stored::SKEW_US`, a count or debt beyond any
    /// limit's) is corrupt state; a time ahead by less, which a master's clock a little ahead of
    /// this one may have written, is read as it is (the limiter carries on from it).
    fn decode(
        fields: [Option<&[u8]>; N],
        request: &Request<Self::Params>,
        now_us: i64,
    ) -> Result<Self::State, ErrorReply>;
    fn decide(
        request: &Request<Self::Params>,
        now_us: i64,
        prior: Option<Self::State>,
    ) -> (Reply, Option<FieldsWrite<N>>);
    /// `delta` units refunded (negative) or charged (positive) without an admission check
    /// (`RL.SETTLE`): the state after and what to store, or `None` when nothing changes.
    fn settle(
        request: &Request<Self::Params>,
        delta: f64,
        now_us: i64,
        prior: Option<Self::State>,
    ) -> Option<(Self::State, FieldsWrite<N>)>;
}

/// The numbers of a stored string: split at the first `N - 1` spaces, so that the last part
/// holds the rest (a value with more parts fails the last number's check); parts that are not
/// there are `None`.
pub fn split_fields<const N: usize>(value: &[u8]) -> [Option<&[u8]>; N] {
    let mut out: [Option<&[u8]>; N] = [None; N];
    for (slot, part) in out.iter_mut().zip(value.splitn(N, |&b| b == b' ')) {
        *slot = Some(part);
    }
    out
}

/// The most numbers a stored value holds (the sliding window's three; `store_write` fails to
/// compile for a limiter of more). Kept small: the value is built on the stack, zeroed first.
pub const MAX_FIELDS: usize = 3;

/// The longest tag.
const MAX_TAG: usize = 8;

/// A stored value being built: the tag, then `%.17g` numbers, separated by single spaces.
pub struct Encoded {
    buf: [u8; MAX_TAG + 1 + MAX_FIELDS * (G17_MAX_LEN + 1)],
    len: usize,
}

impl Encoded {
    /// A value built and returned (for tests; `store_write` builds it where it writes from).
    #[cfg(test)]
    pub fn new(tag: &[u8], values: &[f64]) -> Encoded {
        let mut out = Encoded::empty();
        out.write(tag, values);
        out
    }

    fn empty() -> Encoded {
        Encoded {
            buf: [0; MAX_TAG + 1 + MAX_FIELDS * (G17_MAX_LEN + 1)],
            len: 0,
        }
    }

    /// Writes the value in place (where the caller keeps it: returning it would copy it).
    fn write(&mut self, tag: &[u8], values: &[f64]) {
        if let (Some(dest), false) = (self.buf.get_mut(..tag.len()), tag.is_empty()) {
            dest.copy_from_slice(tag);
            self.len = tag.len();
        }
        for (i, v) in values.iter().take(MAX_FIELDS).enumerate() {
            if (i > 0 || self.len > 0)
                && let Some(b) = self.buf.get_mut(self.len)
            {
                *b = b' ';
                self.len += 1;
            }
            // Formatted in place: a number's widest form fits after any before it.
            if let Some(Ok(number)) = self
                .buf
                .get_mut(self.len..self.len + G17_MAX_LEN)
                .map(<&mut [u8; G17_MAX_LEN]>::try_from)
            {
                self.len += format_g17(*v, number);
            }
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or_default()
    }
}

/// Reads a limiter's state from any layout it was written in: `None` for an empty key. A value
/// tagged by another kind of limiter, or a hash with fields the limiter never wrote, is an
/// error, and nothing is written.
#[inline(always)]
fn load<L: FieldsLimiter<N>, S: Store + ?Sized, const N: usize>(
    store: &S,
    request: &Request<L::Params>,
    now_us: i64,
) -> Result<Option<L::State>, ErrorReply> {
    match store.read()? {
        Slot::Empty => Ok(None),
        Slot::WrongType | Slot::Zset => Err(WRONGTYPE),
        Slot::Value(value) => {
            let numbers = match kind::after_tag(value, L::KIND) {
                // The limiter's own tag, as every write of it leaves.
                Some(rest) => rest,
                None => match kind::split_tag(value) {
                    Some((k, rest)) if k == L::KIND => rest,
                    Some((holder, _)) => return Err(kind::foreign(holder, L::KIND)),
                    // Written before values had tags; tagged by the next write.
                    None => value,
                },
            };
            L::decode(split_fields::<N>(numbers), request, now_us).map(Some)
        }
        Slot::Hash => {
            if store.hash_len()? > N as i64 {
                return Err(FOREIGN_HASH);
            }
            let mut held: [Option<Vec<u8>>; N] = [const { None }; N];
            store.legacy_fields(&L::FIELDS, &mut held)?;
            L::decode(held.each_ref().map(|v| v.as_deref()), request, now_us).map(Some)
        }
    }
}

fn store_write<L: FieldsLimiter<N>, S: Store + ?Sized, const N: usize>(
    store: &mut S,
    write: &FieldsWrite<N>,
) -> Result<(), ErrorReply> {
    const {
        assert!(
            N <= MAX_FIELDS,
            "a stored value holds at most MAX_FIELDS numbers"
        )
    };
    let mut value = Encoded::empty();
    value.write(kind::tag(L::KIND), &write.values);
    store.apply(&Effect::Set {
        value: value.as_bytes(),
        expire_at_ms: write.expire_at_ms,
    })
}

/// One call of a limiter of numbers: the arguments after the key, then its key. Inlined where the
/// registry names it, so that the key's type is known there again.
#[inline(always)]
pub fn run<L: FieldsLimiter<N>, const N: usize>(
    args: &[&[u8]],
    key: &mut dyn OpenStore,
    now_us: i64,
) -> Result<Reply, ErrorReply> {
    let request = parse::<L, N>(args)?;
    apply::<L, _, N>(key.open()?, &request, now_us)
}

/// The arguments after the key, ending with a cost or with `UPTO n` in its place (parsed with a
/// cost of 1 there, so that a call with both has one argument too many); the request of the
/// limiter's last arguments that parsed when they are the same bytes.
pub fn parse<L: FieldsLimiter<N>, const N: usize>(
    args: &[&[u8]],
) -> Result<Request<L::Params>, ErrorReply> {
    remembered::parse(L::remembered(), args, parse_args::<L, N>)
}

fn parse_args<L: FieldsLimiter<N>, const N: usize>(
    args: &[&[u8]],
) -> Result<Request<L::Params>, ErrorReply> {
    match split_upto(args, &UPTO_ARG)? {
        // `UPTO n` stands in for the cost, never for a parameter.
        (params, Some(_)) if params.len() != L::PARAMS => Err(L::ARITY_ERROR),
        (params, Some(n)) => with_last(params, b"1", L::ARITY_ERROR, L::parse).map(|r| Request {
            op: Operation::UpTo(n),
            ..r
        }),
        (_, None) => L::parse(args),
    }
}

/// Loads, decides and stores for one call whose arguments are already parsed.
#[inline(always)]
pub fn apply<L: FieldsLimiter<N>, S: Store + ?Sized, const N: usize>(
    store: &mut S,
    request: &Request<L::Params>,
    now_us: i64,
) -> Result<Reply, ErrorReply> {
    let prior = load::<L, S, N>(store, request, now_us)?;
    let (reply, write) = decide::<L, N>(request, now_us, prior);
    if let Some(write) = write {
        store.writable()?;
        store_write::<L, S, N>(store, &write)?;
    }
    Ok(reply)
}

/// Decides a call's operation on the state it read: a partial grant as the consumptions of
/// `store::grant`.
#[inline(always)]
fn decide<L: FieldsLimiter<N>, const N: usize>(
    request: &Request<L::Params>,
    now_us: i64,
    prior: Option<L::State>,
) -> (Reply, Option<FieldsWrite<N>>) {
    match request.op {
        Operation::UpTo(n) => {
            let outcome = grant(n, |op| {
                Ok::<_, Infallible>(L::decide(&Request { op, ..*request }, now_us, prior))
            });
            match outcome {
                Ok(decided) => decided,
                Err(never) => match never {},
            }
        }
        _ => L::decide(request, now_us, prior),
    }
}

pub struct LimitOf<L: FieldsLimiter<N>, const N: usize> {
    request: Request<L::Params>,
    prior: Option<L::State>,
    write: Option<FieldsWrite<N>>,
}

impl<L: FieldsLimiter<N>, const N: usize> LimitOf<L, N> {
    /// `params` are the limit's arguments without the cost.
    pub fn parse(params: &[&[u8]], cost: &[u8]) -> Result<Self, ErrorReply> {
        Ok(Self {
            request: with_last(params, cost, L::ARITY_ERROR, L::parse)?,
            prior: None,
            write: None,
        })
    }

    /// A partial grant of at most `n` units with these parameters.
    pub fn parse_upto(params: &[&[u8]], n: f64) -> Result<Self, ErrorReply> {
        let mut limit = Self::parse(params, b"1")?;
        limit.request.op = Operation::UpTo(n);
        Ok(limit)
    }
}

impl<L: FieldsLimiter<N>, const N: usize> Limit for LimitOf<L, N> {
    fn decide(&mut self, store: &dyn Store, now_us: i64) -> Result<Reply, ErrorReply> {
        self.prior = load::<L, _, N>(store, &self.request, now_us)?;
        let (reply, write) = decide::<L, N>(&self.request, now_us, self.prior);
        self.write = write;
        Ok(reply)
    }

    fn peek(&self, _: &dyn Store, now_us: i64) -> Result<Reply, ErrorReply> {
        let peek = Request {
            op: Operation::Peek,
            ..self.request
        };
        Ok(L::decide(&peek, now_us, self.prior).0)
    }

    fn writes(&self) -> bool {
        self.write.is_some()
    }

    fn commit(&self, store: &mut dyn Store) -> Result<(), ErrorReply> {
        match &self.write {
            Some(write) => store_write::<L, _, N>(store, write),
            None => Ok(()),
        }
    }

    fn set_op(&mut self, op: Operation) {
        self.request.op = op;
    }
}

/// One limit of an `RL.SETTLE` call: it always admits; its reply is the state after settlement
/// as a peek reports it, with `allowed` 1 and no wait.
pub struct SettleOf<L: FieldsLimiter<N>, const N: usize> {
    request: Request<L::Params>,
    delta: f64,
    write: Option<FieldsWrite<N>>,
    reply: Option<Reply>,
}

impl<L: FieldsLimiter<N>, const N: usize> SettleOf<L, N> {
    /// `params` are the limit's arguments without the cost.
    pub fn parse(params: &[&[u8]], delta: f64) -> Result<Self, ErrorReply> {
        Ok(Self {
            request: LimitOf::<L, N>::parse(params, b"0")?.request,
            delta,
            write: None,
            reply: None,
        })
    }
}

/// A settled limit's reply: what a peek reports, admitted and with nothing to wait for.
pub fn settled(peek: Reply) -> Reply {
    Reply {
        allowed: true,
        retry_after_ms: 0,
        ..peek
    }
}

impl<L: FieldsLimiter<N>, const N: usize> Limit for SettleOf<L, N> {
    fn decide(&mut self, store: &dyn Store, now_us: i64) -> Result<Reply, ErrorReply> {
        let prior = load::<L, _, N>(store, &self.request, now_us)?;
        let after = match L::settle(&self.request, self.delta, now_us, prior) {
            Some((state, write)) => {
                self.write = Some(write);
                Some(state)
            }
            None => prior,
        };
        let reply = settled(L::decide(&self.request, now_us, after).0);
        self.reply = Some(reply);
        Ok(reply)
    }

    fn writes(&self) -> bool {
        self.write.is_some()
    }

    fn peek(&self, store: &dyn Store, now_us: i64) -> Result<Reply, ErrorReply> {
        // A settlement always admits, so no denial asks for a peek; the reply stands.
        match self.reply {
            Some(reply) => Ok(reply),
            None => Ok(settled(
                L::decide(
                    &self.request,
                    now_us,
                    load::<L, _, N>(store, &self.request, now_us)?,
                )
                .0,
            )),
        }
    }

    fn commit(&self, store: &mut dyn Store) -> Result<(), ErrorReply> {
        match &self.write {
            Some(write) => store_write::<L, _, N>(store, write),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(values: &[f64]) -> String {
        String::from_utf8(Encoded::new(b"", values).as_bytes().to_vec()).unwrap()
    }

    #[test]
    fn a_stored_value_is_g17_numbers_separated_by_spaces() {
        assert_eq!(
            encoded(&[4.5, 1_700_000_000_123_456.0]),
            "4.5 1700000000123456"
        );
        assert_eq!(encoded(&[1.0 / 3.0]), "0.33333333333333331");
        assert_eq!(encoded(&[0.0, -0.0, 1e-7]), "0 -0 9.9999999999999995e-08");
        let widest = [-f64::MIN_POSITIVE; MAX_FIELDS];
        assert_eq!(
            encoded(&widest).len(),
            MAX_FIELDS * 25 - 1,
            "{}",
            encoded(&widest)
        );
        let tagged = Encoded::new(b"tb", &[4.5, 17.0]);
        assert_eq!(tagged.as_bytes(), b"tb 4.5 17");
        let longest = Encoded::new(&[b'a'; MAX_TAG], &widest);
        assert_eq!(longest.as_bytes().len(), MAX_TAG + MAX_FIELDS * 25);
        assert!(
            crate::store::kind::KINDS
                .iter()
                .all(|k| k.1.is_none_or(|t| t.len() <= MAX_TAG))
        );
    }

    #[test]
    fn splitting_keeps_the_rest_in_the_last_part() {
        let s = |v: &'static str| split_fields::<2>(v.as_bytes());
        assert_eq!(s("4.5 17"), [Some(&b"4.5"[..]), Some(&b"17"[..])]);
        assert_eq!(s("4.5 17 9"), [Some(&b"4.5"[..]), Some(&b"17 9"[..])]);
        assert_eq!(s("4.5"), [Some(&b"4.5"[..]), None]);
        assert_eq!(s(""), [Some(&b""[..]), None]);
        assert_eq!(s(" 17"), [Some(&b""[..]), Some(&b"17"[..])]);
        assert_eq!(split_fields::<1>(b"1 2"), [Some(&b"1 2"[..])]);
    }
}
