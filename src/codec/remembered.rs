//! The last arguments a limiter parsed, and what they parsed to.
//!
//! A limiter is called again and again with the same parameters (one limit per endpoint or
//! plan), and parsing them is a fifth of a denial's own work. A call whose argument bytes are
//! those of the last call that parsed is given that call's result: parsing is a function of the
//! bytes alone, so it is the result a parse would give. Only results that parsed are kept (an
//! error is parsed again, and answers the same). One entry per limiter, of at most `MAX_BYTES`
//! bytes of arguments: longer ones are parsed every time. Kept by the server's main thread
//! (`codec::owner`); a call on any other thread parses.

use std::cell::Cell;

use super::owner::Owned;

/// The most argument bytes an entry keeps (a limiter's arguments after its key: `10 1 60`, or
/// `100 10 1 UPTO 5`, are a few bytes each).
pub const MAX_BYTES: usize = 48;
/// The most arguments an entry keeps.
pub const MAX_ARGS: usize = 8;

/// One limiter's last arguments that parsed, and their result.
pub struct Remembered<T: Copy> {
    last: Cell<Option<Entry<T>>>,
}

#[derive(Clone, Copy)]
struct Entry<T> {
    /// The arguments' bytes, one after another.
    bytes: [u8; MAX_BYTES],
    /// Each argument's length, in order; `count` of them are used.
    lens: [u8; MAX_ARGS],
    count: usize,
    value: T,
}

impl<T: Copy> Entry<T> {
    /// The arguments as an entry, if they fit.
    fn of(args: &[&[u8]], value: T) -> Option<Entry<T>> {
        if args.len() > MAX_ARGS {
            return None;
        }
        let mut entry = Entry {
            bytes: [0; MAX_BYTES],
            lens: [0; MAX_ARGS],
            count: args.len(),
            value,
        };
        let mut at = 0;
        for (len, arg) in entry.lens.iter_mut().zip(args) {
            let end = at + arg.len();
            entry.bytes.get_mut(at..end)?.copy_from_slice(arg);
            *len = u8::try_from(arg.len()).ok()?;
            at = end;
        }
        Some(entry)
    }

    /// Whether `args` are the kept arguments, byte for byte.
    fn holds(&self, args: &[&[u8]]) -> bool {
        if args.len() != self.count {
            return false;
        }
        let mut at = 0;
        for (len, arg) in self.lens.iter().zip(args) {
            let len = usize::from(*len);
            if arg.len() != len || self.bytes.get(at..at + len) != Some(*arg) {
                return false;
            }
            at += len;
        }
        true
    }
}

impl<T: Copy> Remembered<T> {
    pub const fn new() -> Self {
        Remembered {
            last: Cell::new(None),
        }
    }

    /// `parse(args)`: the kept result when `args` are the kept arguments, else parsed and kept
    /// when it parses.
    #[inline(always)]
    pub fn parse<E>(
        &self,
        args: &[&[u8]],
        parse: impl FnOnce(&[&[u8]]) -> Result<T, E>,
    ) -> Result<T, E> {
        if let Some(entry) = self.last.get()
            && entry.holds(args)
        {
            return Ok(entry.value);
        }
        let value = parse(args)?;
        if let Some(entry) = Entry::of(args, value) {
            self.last.set(Some(entry));
        }
        Ok(value)
    }
}

/// `parse(args)` through the `Remembered` in `last` (a static of the limiter's command file), on
/// the thread that keeps it (`codec::owner`); parsed as it is on any other.
#[inline(always)]
pub fn parse<T: Copy, E>(
    last: &'static Owned<Remembered<T>>,
    args: &[&[u8]],
    parse: impl Fn(&[&[u8]]) -> Result<T, E>,
) -> Result<T, E> {
    match last.get() {
        Some(r) => r.parse(args, &parse),
        None => parse(args),
    }
}

impl<T: Copy> Default for Remembered<T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A parse that counts its calls and reads the arguments' lengths.
    fn counted(calls: &Cell<u32>) -> impl Fn(&[&[u8]]) -> Result<usize, &'static str> + '_ {
        move |args| {
            calls.set(calls.get() + 1);
            if args.first() == Some(&&b"bad"[..]) {
                return Err("bad");
            }
            Ok(args.iter().map(|a| a.len()).sum::<usize>() * 10 + args.len())
        }
    }

    #[test]
    fn the_same_bytes_are_parsed_once_and_other_bytes_again() {
        let calls = Cell::new(0);
        let r = Remembered::new();
        let parse = counted(&calls);
        assert_eq!(r.parse(&[b"10", b"1", b"60"], &parse), Ok(53));
        assert_eq!(r.parse(&[b"10", b"1", b"60"], &parse), Ok(53));
        assert_eq!(calls.get(), 1);
        // The same bytes split otherwise, one byte changed, one argument more or fewer.
        for args in [
            &[&b"1"[..], b"01", b"60"][..],
            &[b"10", b"1", b"61"],
            &[b"10", b"1", b"60", b"1"],
            &[b"10", b"1"],
            &[b"10", b"160"],
            &[],
        ] {
            let before = calls.get();
            assert_eq!(r.parse(args, &parse), parse(args));
            assert_eq!(calls.get(), before + 2, "{args:?}");
        }
    }

    #[test]
    fn errors_are_not_kept_and_leave_the_last_result() {
        let calls = Cell::new(0);
        let r = Remembered::new();
        let parse = counted(&calls);
        assert_eq!(r.parse(&[b"5"], &parse), Ok(11));
        assert_eq!(r.parse(&[b"bad"], &parse), Err("bad"));
        assert_eq!(r.parse(&[b"bad"], &parse), Err("bad"));
        assert_eq!(calls.get(), 3);
        assert_eq!(r.parse(&[b"5"], &parse), Ok(11));
        assert_eq!(calls.get(), 3);
    }

    #[test]
    fn arguments_too_long_to_keep_are_parsed_every_time() {
        let calls = Cell::new(0);
        let r = Remembered::new();
        let parse = counted(&calls);
        let long = [b'7'; MAX_BYTES + 1];
        let nine: [&[u8]; MAX_ARGS + 1] = [b"1"; MAX_ARGS + 1];
        let widest = [b'7'; MAX_BYTES];
        for args in [&[&long[..]][..], &nine[..]] {
            let before = calls.get();
            assert_eq!(r.parse(args, &parse), r.parse(args, &parse));
            assert_eq!(calls.get(), before + 2);
        }
        let before = calls.get();
        assert_eq!(
            r.parse(&[&widest[..]], &parse),
            r.parse(&[&widest[..]], &parse)
        );
        assert_eq!(calls.get(), before + 1);
    }
}
