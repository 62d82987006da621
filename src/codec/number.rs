//! Number grammar and formatting shared by command arguments and stored state.
//!
//! The Lua twins accept exactly the same strings (see `lua-reference/`), so both paths agree on
//! what is a number. Values are read as IEEE doubles with correct rounding, as C's `strtod` does
//! (Lua's `tonumber`), and written the way Redis turns a Lua number into a string: `%.17g`.

/// Whether `s` starts with `-`, and `s` without its sign (`+` or `-`), if it has one.
fn split_sign(s: &[u8]) -> (bool, &[u8]) {
    match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, s),
    }
}

/// The longest number the grammar accepts, in bytes: a longer string is not a number, refused
/// before any of it is read (every value the limiters take or store fits in far fewer).
pub const MAX_NUMBER_LEN: usize = 64;

/// `[+-]?[0-9]+`, at most `MAX_NUMBER_LEN` bytes.
pub fn is_integer(s: &[u8]) -> bool {
    if s.len() > MAX_NUMBER_LEN {
        return false;
    }
    let (_, digits) = split_sign(s);
    !digits.is_empty() && digits.iter().all(u8::is_ascii_digit)
}

/// `[+-]?(digits[.digits?] | .digits)([eE][+-]?digits)?` — no `inf`, `nan`, hex or spaces —,
/// at most `MAX_NUMBER_LEN` bytes.
pub fn is_decimal(s: &[u8]) -> bool {
    if s.len() > MAX_NUMBER_LEN {
        return false;
    }
    // Split off an exponent the way the Lua twin does: everything after the first e/E.
    let (mantissa, exponent) = match s.iter().position(|&c| c == b'e' || c == b'E') {
        Some(at) => (&s[..at], Some(&s[at + 1..])),
        None => (s, None),
    };
    if let Some(exp) = exponent
        && !is_integer(exp)
    {
        return false;
    }
    let (_, unsigned) = split_sign(mantissa);
    let (int_part, frac_part) = match unsigned.iter().position(|&c| c == b'.') {
        Some(dot) => (&unsigned[..dot], Some(&unsigned[dot + 1..])),
        None => (unsigned, None),
    };
    let all_digits = |p: &[u8]| p.iter().all(u8::is_ascii_digit);
    match frac_part {
        None => !int_part.is_empty() && all_digits(int_part),
        Some(frac) => {
            all_digits(int_part) && all_digits(frac) && !(int_part.is_empty() && frac.is_empty())
        }
    }
}

/// Reads a string that `is_decimal` (or `is_integer`) accepted. Rust's parser rounds correctly,
/// as glibc's `strtod` does, so both paths get the same double; out-of-range exponents give
/// infinity or zero, which callers reject by range.
fn general(s: &[u8]) -> Option<f64> {
    std::str::from_utf8(s).ok()?.parse::<f64>().ok()
}

/// 10^0 ... 10^19, all exact in a double (up to 10^22 are); at most 19 digits are read.
const EXACT_POWERS_OF_TEN: [f64; 20] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19,
];

/// Fast path for `[+-]?digits.digits` without an exponent whose digits, read as one integer,
/// are at most 2^53 (`0.001`, `2.5`, `1000.75`): that integer and 10^(fraction digits) are both
/// exact doubles, and one IEEE division of exact operands is correctly rounded, so the result is
/// the one the general parser gives (Clinger's fast path). `None` sends the string to it.
fn small_fraction(s: &[u8]) -> Option<f64> {
    let (negative, unsigned) = split_sign(s);
    let dot = unsigned.iter().position(|&c| c == b'.')?;
    let (int_part, frac_part) = (unsigned.get(..dot)?, unsigned.get(dot + 1..)?);
    if int_part.len() + frac_part.len() > 19 || (int_part.is_empty() && frac_part.is_empty()) {
        return None;
    }
    let scale = *EXACT_POWERS_OF_TEN.get(frac_part.len())?;
    let n = digits_value(int_part)? * scale as u64 + digits_value(frac_part)?;
    if n > 1 << f64::MANTISSA_DIGITS {
        return None;
    }
    let v = n as f64 / scale;
    Some(if negative { -v } else { v })
}

/// The value of 1 to 19 ASCII digits (leading zeros allowed, no sign), or `None` for anything
/// else: at most 19 digits never overflow a `u64`.
pub fn parse_digits(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 19 {
        return None;
    }
    digits_value(s)
}

/// The value of at most 19 ASCII digits (0 for none), or `None` if a byte is not a digit.
#[inline(always)]
fn digits_value(digits: &[u8]) -> Option<u64> {
    // Sixteen digits, every microsecond time from 2001 to 2286 (most stored values), without
    // the loop.
    if let ([a, b], []) = digits.as_chunks::<8>() {
        return Some(eight_digits(*a)? * 100_000_000 + eight_digits(*b)?);
    }
    let mut n: u64 = 0;
    let mut rest = digits;
    // Eight digits at a time (a 16-digit timestamp is two steps), then one at a time.
    while let Some((chunk, tail)) = rest.split_first_chunk::<8>() {
        n = n * 100_000_000 + eight_digits(*chunk)?;
        rest = tail;
    }
    for &d in rest {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n * 10 + u64::from(d - b'0');
    }
    Some(n)
}

/// Fast path for the common case, plain digits with an optional sign whose value is at most 2^53
/// (microsecond timestamps are 16 digits): the integer is exact in a double, so converting it is
/// the correctly rounded result too.
#[inline(always)]
fn small_integer(s: &[u8]) -> Option<f64> {
    const EXACT: u64 = 1 << f64::MANTISSA_DIGITS;
    let (negative, digits) = split_sign(s);
    // 19 digits cannot overflow a u64.
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    let n = digits_value(digits)?;
    if n > EXACT {
        return None;
    }
    let v = n as f64;
    Some(if negative { -v } else { v })
}

/// The value of eight ASCII digits, or `None` if any byte is not one: the bytes are read as one
/// little-endian word and combined pairwise (2, then 4, then 8 digits) in three multiplications.
fn eight_digits(chunk: [u8; 8]) -> Option<u64> {
    const HIGH_NIBBLES: u64 = 0xF0F0_F0F0_F0F0_F0F0;
    const ZEROS: u64 = 0x3030_3030_3030_3030;
    let word = u64::from_le_bytes(chunk);
    // Every byte is 0x30..=0x39: its high nibble is 3, and adding 6 keeps it 3. (A byte that
    // fails the first test may carry into the next in the second; the first already failed.)
    if word & HIGH_NIBBLES != ZEROS
        || word.wrapping_add(0x0606_0606_0606_0606) & HIGH_NIBBLES != ZEROS
    {
        return None;
    }
    let d = word - ZEROS;
    // Each even byte becomes the two-digit value of its byte pair...
    let pairs = d.wrapping_mul(10).wrapping_add(d >> 8);
    // ...then two pairs make four digits and two fours make eight, in the top half.
    let low = pairs & 0x0000_00FF_0000_00FF;
    let high = (pairs >> 16) & 0x0000_00FF_0000_00FF;
    Some(
        low.wrapping_mul(100 + (1_000_000 << 32))
            .wrapping_add(high.wrapping_mul(1 + (10_000 << 32)))
            >> 32,
    )
}

/// A decimal string as a double, or `None` if it is not in the grammar.
pub fn parse_decimal(s: &[u8]) -> Option<f64> {
    if s.len() > MAX_NUMBER_LEN {
        return None;
    }
    // Plain digits are in both grammars; the fast path checks them itself.
    small_integer(s)
        .or_else(|| small_fraction(s))
        .or_else(|| if is_decimal(s) { general(s) } else { None })
}

/// An integer string as a double (Lua has no other number type), or `None` if not in the grammar.
pub fn parse_integer(s: &[u8]) -> Option<f64> {
    small_integer(s).or_else(|| if is_integer(s) { general(s) } else { None })
}

/// Longest `%.17g` output: sign, 17 digits, point, `e-308`.
pub const G17_MAX_LEN: usize = 32;

/// Writes `value` as C's `printf("%.17g")` does, which is what Redis stores for a Lua number
/// passed to `redis.call`. Returns the used length of `buf`.
pub fn format_g17(value: f64, buf: &mut [u8; G17_MAX_LEN]) -> usize {
    // Integers below 1e17 print as plain digits under %.17g; this covers timestamps and whole
    // token counts without going through printf.
    // (`as` saturates, and NaN becomes 0, so the round trip holds only for integers.)
    let whole = value as i64;
    if whole as f64 == value && value.abs() < 1e17 && !(value == 0.0 && value.is_sign_negative()) {
        return format_i64(whole, buf);
    }
    if let Some(len) = g17_layout(value, buf) {
        return len;
    }
    // Not reached for finite values; kept for infinities and NaN, which printf spells its way.
    // SAFETY: the buffer is writable for its whole length, the format string is NUL-terminated
    // and consumes exactly one double; snprintf never writes past the given size.
    let written = unsafe {
        libc::snprintf(
            buf.as_mut_ptr().cast(),
            G17_MAX_LEN,
            c"%.17g".as_ptr(),
            value,
        )
    };
    usize::try_from(written).map_or(0, |n| n.min(G17_MAX_LEN - 1))
}

/// `%.17g` of a finite double without printf (glibc's takes about 400 ns): the 17 correctly
/// rounded significant digits (exact ties to even, as glibc) and the decimal exponent come from
/// `exact_digits`, or from Rust's `{:.16e}` outside its range; then `%g`'s layout is applied:
/// plain notation for decimal exponents -4..=16, else `d.ddde±XX`, trailing zeros dropped.
/// `None` for infinities and NaN.
fn g17_layout(value: f64, buf: &mut [u8; G17_MAX_LEN]) -> Option<usize> {
    if !value.is_finite() {
        return None;
    }
    let (n, exponent) = match exact_digits(value.abs()) {
        Some(found) => found,
        None => formatted_digits(value.abs())?,
    };
    let mut digits = [b'0'; 17];
    let mut rest = n;
    for slot in digits.iter_mut().rev() {
        *slot = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    let significant = digits.iter().rposition(|&d| d != b'0').map_or(1, |i| i + 1);
    let digits = digits.get(..significant)?;
    let negative = value.is_sign_negative();

    let mut out = ByteWriter::<G17_MAX_LEN>::default();
    if negative {
        out.push(b'-');
    }
    match exponent {
        0..=16 => {
            let int_len = usize::try_from(exponent).ok()? + 1;
            for i in 0..int_len {
                out.push(digits.get(i).copied().unwrap_or(b'0'));
            }
            if let Some(fraction) = digits.get(int_len..).filter(|f| !f.is_empty()) {
                out.push(b'.');
                out.extend(fraction);
            }
        }
        -4..=-1 => {
            out.extend(b"0.");
            for _ in 0..(-1 - exponent) {
                out.push(b'0');
            }
            out.extend(digits);
        }
        _ => {
            let (first, rest) = digits.split_first()?;
            out.push(*first);
            if !rest.is_empty() {
                out.push(b'.');
                out.extend(rest);
            }
            out.push(b'e');
            out.push(if exponent < 0 { b'-' } else { b'+' });
            // At least two digits, as printf (at most three for a double).
            let magnitude = exponent.unsigned_abs();
            if magnitude >= 100 {
                out.push(b'0' + (magnitude / 100 % 10) as u8);
            }
            out.push(b'0' + (magnitude / 10 % 10) as u8);
            out.push(b'0' + (magnitude % 10) as u8);
        }
    }
    if out.overflowed {
        return None;
    }
    let len = out.len;
    buf.get_mut(..len)?.copy_from_slice(out.bytes());
    Some(len)
}

/// 10^0 ..= 10^22 (10^22 * 2^53 < 2^127).
const POW10: [u128; 23] = {
    let mut table = [1u128; 23];
    let mut i = 1;
    while i < table.len() {
        table[i] = table[i - 1] * 10;
        i += 1;
    }
    table
};

/// The 17 significant digits (as one integer in 10^16..10^17) and the decimal exponent of
/// `v`, for 1e-5 <= v < 2^53, which covers the limiters' fractional state. Exact: with
/// v = m * 2^-s, v * 10^k = m * 10^k / 2^s fits in a u128, and the remainder decides the
/// rounding (half to even, as printf).
fn exact_digits(v: f64) -> Option<(u64, i32)> {
    const LOW: u128 = 10_000_000_000_000_000; // 10^16
    const HIGH: u128 = 100_000_000_000_000_000; // 10^17
    if !(1e-5..9_007_199_254_740_992.0).contains(&v) {
        return None;
    }
    let bits = v.to_bits();
    let mantissa = u128::from((bits & ((1 << 52) - 1)) | (1 << 52));
    let shift = 1075 - i32::try_from((bits >> 52) & 0x7ff).ok()?;
    if !(1..=127).contains(&shift) {
        return None;
    }
    let below = (1u128 << shift) - 1;
    let half = 1u128 << (shift - 1);
    // log10 can be one off near powers of ten; the digit count corrects it.
    let mut exponent = v.log10().floor() as i32;
    for _ in 0..3 {
        let scale = POW10.get(usize::try_from(16 - exponent).ok()?)?;
        let scaled = mantissa * scale;
        let (q, r) = (scaled >> shift, scaled & below);
        let n = q + u128::from(r > half || (r == half && q & 1 == 1));
        if n >= HIGH {
            exponent += 1;
        } else if n < LOW {
            exponent -= 1;
        } else {
            return Some((u64::try_from(n).ok()?, exponent));
        }
    }
    None
}

/// The same as `exact_digits` for any finite positive double, through Rust's exact formatting.
fn formatted_digits(v: f64) -> Option<(u64, i32)> {
    use std::fmt::Write as _;
    let mut sci = ByteWriter::<40>::default();
    write!(sci, "{v:.16e}").ok()?;
    let text = sci.bytes();
    let e_at = text.iter().position(|&c| c == b'e')?;
    let (mantissa, exponent) = text.split_at(e_at);
    let exponent: i32 = std::str::from_utf8(exponent.get(1..)?).ok()?.parse().ok()?;
    let mut n: u64 = 0;
    let mut count = 0;
    for d in mantissa.iter().filter(|c| c.is_ascii_digit()) {
        n = n * 10 + u64::from(d - b'0');
        count += 1;
    }
    (count == 17).then_some((n, exponent))
}

/// A fixed-size byte buffer that refuses to overflow (and remembers that it had to).
struct ByteWriter<const N: usize> {
    buf: [u8; N],
    len: usize,
    overflowed: bool,
}

impl<const N: usize> Default for ByteWriter<N> {
    fn default() -> Self {
        Self {
            buf: [0; N],
            len: 0,
            overflowed: false,
        }
    }
}

impl<const N: usize> ByteWriter<N> {
    fn bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or_default()
    }

    fn push(&mut self, byte: u8) {
        match self.buf.get_mut(self.len) {
            Some(slot) => {
                *slot = byte;
                self.len += 1;
            }
            None => self.overflowed = true,
        }
    }

    fn extend(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.push(b);
        }
    }
}

impl<const N: usize> std::fmt::Write for ByteWriter<N> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.extend(s.as_bytes());
        if self.overflowed {
            Err(std::fmt::Error)
        } else {
            Ok(())
        }
    }
}

/// Decimal text of an integer, without allocating; returns the used length of `buf`.
pub fn format_i64(value: i64, buf: &mut [u8; G17_MAX_LEN]) -> usize {
    let n = value.unsigned_abs();
    let sign = usize::from(value < 0);
    if sign == 1
        && let Some(slot) = buf.first_mut()
    {
        *slot = b'-';
    }
    // Groups of eight digits, left to right (a timestamp in microseconds is two): the leading
    // group, of 1 to 8 digits, then the whole ones. Every group is one 8-byte store; the leading
    // one's bytes past its digits are overwritten by the next (`buf` has room).
    if n < EIGHT_DIGITS {
        return put_leading(buf, sign, n);
    }
    let high = n / EIGHT_DIGITS;
    let at = if high < EIGHT_DIGITS {
        put_leading(buf, sign, high)
    } else {
        let at = put_leading(buf, sign, high / EIGHT_DIGITS);
        put8(buf, at, eight_ascii_digits((high % EIGHT_DIGITS) as u32));
        at + 8
    };
    put8(buf, at, eight_ascii_digits((n % EIGHT_DIGITS) as u32));
    at + 8
}

/// Writes `n < 10^8` at `at` without leading zeros (`0` for zero); returns where it ends.
fn put_leading(buf: &mut [u8; G17_MAX_LEN], at: usize, n: u64) -> usize {
    let word = u64::from_le_bytes(eight_ascii_digits(n as u32));
    // The leading zeros are the word's low bytes that are '0' (one digit is kept for 0).
    let zeros = ((word - ZERO_DIGITS) | (1 << 56)).trailing_zeros() as usize / 8;
    put8(buf, at, (word >> (8 * zeros)).to_le_bytes());
    at + 8 - zeros
}

/// Eight ASCII `0`s.
const ZERO_DIGITS: u64 = 0x3030_3030_3030_3030;

/// Eight bytes into `buf` at `at` (every caller stays within its 32 bytes).
fn put8(buf: &mut [u8; G17_MAX_LEN], at: usize, bytes: [u8; 8]) {
    if let Some(dst) = buf.get_mut(at..).and_then(|b| b.first_chunk_mut::<8>()) {
        *dst = bytes;
    }
}

const EIGHT_DIGITS: u64 = 100_000_000;

/// The eight decimal digits of `n < 10^8` (leading zeros included) as ASCII, in three rounds of
/// lane arithmetic on one word instead of eight divisions: the number is split into two groups
/// of four digits, each into two of two, each into two digits, every lane divided by 100 or 10
/// through a multiplication and a shift that is exact for the lane's range.
fn eight_ascii_digits(n: u32) -> [u8; 8] {
    let n = u64::from(n);
    // Lanes of 32 bits: the first four digits in the low lane, the last four in the high one
    // (the low byte is written first).
    let fours = (n / 10_000) | ((n % 10_000) << 32);
    // x / 100 == (x * 10486) >> 20 for x < 43,699; lanes stay below 10^4 * 10486 < 2^27.
    let hundreds = ((fours * 10_486) >> 20) & ((0x7F << 32) | 0x7F);
    // Lanes of 16 bits: each group's first two digits low, last two high.
    let twos = ((fours - 100 * hundreds) << 16) | hundreds;
    // x / 10 == (x * 103) >> 10 for x < 179; lanes stay below 99 * 103 < 2^14.
    let tens = ((twos * 103) >> 10) & 0x000F_000F_000F_000F;
    // Lanes of 8 bits: one digit each.
    let digits = ((twos - 10 * tens) << 8) | tens;
    (digits | 0x3030_3030_3030_3030).to_le_bytes()
}

/// 2^52: every double of at least this magnitude is a whole number (or not a number).
const WHOLE_FROM: f64 = 4_503_599_627_370_496.0;

/// `x.trunc()`, bit for bit, in a few instructions. The standard library's rounding functions
/// are calls into the compiler's own math library on the baseline x86-64 this module is built
/// for (no `roundsd`), about 23 instructions each, and a limiter rounds several times per call.
/// Below 2^52 the integer conversion truncates exactly; the sign is copied back, so that a value
/// that rounds to zero keeps its sign (`-0.5` gives `-0.0`), as IEEE rounding does.
#[inline(always)]
pub fn trunc(x: f64) -> f64 {
    if x.abs() < WHOLE_FROM {
        truncated(x).copysign(x)
    } else {
        x
    }
}

/// `x` truncated toward zero, for `|x| < 2^52` (checked by every caller).
#[inline(always)]
fn truncated(x: f64) -> f64 {
    debug_assert!(x.abs() < WHOLE_FROM);
    // SAFETY: `x` is finite and below 2^52 in magnitude, so its truncation is an `i64` (the
    // conversion without the checks `as` adds for NaN and values out of range).
    (unsafe { x.to_int_unchecked::<i64>() }) as f64
}

/// `x.ceil()`, bit for bit (see `trunc`).
#[inline(always)]
pub fn ceil(x: f64) -> f64 {
    if x.abs() < WHOLE_FROM {
        let t = truncated(x);
        (if t < x { t + 1.0 } else { t }).copysign(x)
    } else {
        x
    }
}

/// `x.floor()`, bit for bit (see `trunc`).
#[inline(always)]
pub fn floor(x: f64) -> f64 {
    if x.abs() < WHOLE_FROM {
        let t = truncated(x);
        (if t > x { t - 1.0 } else { t }).copysign(x)
    } else {
        x
    }
}

/// Convenience for tests and cold paths.
pub fn g17_string(value: f64) -> String {
    let mut buf = [0u8; G17_MAX_LEN];
    let len = format_g17(value, &mut buf);
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The inline rounding functions against the standard library's, bit for bit: edges,
    /// every quarter from -10 to 10, values either side of 2^52 and 2^53, and a million random
    /// bit patterns (NaNs of any payload compared as NaN).
    #[test]
    fn inline_rounding_is_the_standard_librarys() {
        fn same(x: f64) {
            for (name, ours, std) in [
                ("trunc", trunc(x), x.trunc()),
                ("ceil", ceil(x), x.ceil()),
                ("floor", floor(x), x.floor()),
            ] {
                assert!(
                    ours.to_bits() == std.to_bits() || (ours.is_nan() && std.is_nan()),
                    "{name}({x:e}) = {ours:e}, std says {std:e}"
                );
            }
        }
        let two52 = 4_503_599_627_370_496.0_f64;
        let mut edges = vec![
            0.0,
            -0.0,
            0.5,
            -0.5,
            1.0,
            -1.0,
            1e-300,
            -1e-300,
            f64::MIN_POSITIVE,
            -f64::MIN_POSITIVE,
            5e-324,
            -5e-324,
            f64::MAX,
            f64::MIN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            9.2e18,
            -9.2e18,
            1e300,
            -1e300,
        ];
        for base in [two52, 2.0 * two52] {
            let mut v = base;
            for _ in 0..4 {
                v = f64::from_bits(v.to_bits() - 1);
                edges.extend([v, -v]);
            }
            let mut v = base;
            for _ in 0..4 {
                edges.extend([v, -v]);
                v = f64::from_bits(v.to_bits() + 1);
            }
        }
        for i in -40..=40 {
            edges.push(f64::from(i) / 4.0);
        }
        for x in edges {
            same(x);
        }
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        for _ in 0..1_000_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            same(f64::from_bits(state));
            // And as many of the magnitudes a limiter meets (below 2^60).
            same((state >> 4) as f64 / 1024.0 * if state & 1 == 0 { 1.0 } else { -1.0 });
        }
    }

    /// A xorshift64 generator from `seed`: reproducible pseudo-random test inputs.
    fn xorshift(seed: u64) -> impl FnMut() -> u64 {
        let mut x = seed;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    #[test]
    fn grammar_accepts_plain_numbers_only() {
        for ok in [
            "0", "-0", "+7", "12", "1.", ".5", "1.5", "1e5", "1E+5", "2.5e-3", "-.5e1",
        ] {
            assert!(is_decimal(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "", ".", "+", "-", "e5", "1e", "1e+", "1.5.2", "inf", "nan", "0x10", " 1", "1 ",
            "1e5e5", "1,5", "--1", "1e5.0", "\u{0}1",
        ] {
            assert!(!is_decimal(bad.as_bytes()), "{bad:?}");
        }
        assert!(is_integer(b"-12") && is_integer(b"+0") && !is_integer(b"1.0"));
        assert!(!is_integer(b"") && !is_integer(b"-") && !is_integer(b"1e3"));
    }

    #[test]
    fn digit_runs_are_read_as_integers() {
        let mut p: u64 = 1;
        for len in 1..=19 {
            for v in [p - 1, p, 2 * p - 1, 9 * p + (p - 1)] {
                let text = format!("{v:0len$}");
                if text.len() == len {
                    assert_eq!(parse_digits(text.as_bytes()), Some(v), "{text}");
                }
            }
            p = p.saturating_mul(10);
        }
        assert_eq!(
            parse_digits(b"9999999999999999999"),
            Some(9_999_999_999_999_999_999)
        );
        assert_eq!(parse_digits(b"0000000000000000001"), Some(1));
        for bad in [
            &b""[..],
            b"00000000000000000001",
            b"+1",
            b"-1",
            b"1 ",
            b" 1",
            b"12345678x",
            b"1234567x9012345678",
            b"1.5",
        ] {
            assert_eq!(
                parse_digits(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn the_integer_fast_path_agrees_with_the_general_parser() {
        for text in [
            "0",
            "-0",
            "+7",
            "123456789012345",
            "-999999999999999",
            "000001",
            "1764560000123456",
            "176456000012345x",
            "1764560x00123456",
            "-1764560000123456",
            "9007199254740992",
            "9007199254740993",
            "-9007199254740993",
            "9999999999999999999",
            "18446744073709551616",
            "0000000000000000000000000000001",
            "1.5",
            "1e3",
        ] {
            let general = std::str::from_utf8(text.as_bytes())
                .ok()
                .and_then(|t| t.parse::<f64>().ok());
            assert_eq!(
                parse_decimal(text.as_bytes()).map(f64::to_bits),
                general.map(f64::to_bits),
                "{text}"
            );
        }
        assert_eq!(small_integer(b"9007199254740992"), Some(9007199254740992.0));
        assert_eq!(
            small_integer(b"9007199254740993"),
            None,
            "above 2^53 a double rounds, so the general parser decides"
        );
        assert_eq!(small_integer(b"12345678901234567890"), None, "20 digits");
    }

    #[test]
    fn parses_with_correct_rounding() {
        assert_eq!(parse_decimal(b"0.1"), Some(0.1));
        assert_eq!(parse_decimal(b"1."), Some(1.0));
        assert_eq!(parse_decimal(b".5"), Some(0.5));
        assert_eq!(parse_decimal(b"1e999"), Some(f64::INFINITY));
        assert_eq!(parse_integer(b"99999999999999999999"), Some(1e20));
        assert_eq!(parse_decimal(b"abc"), None);
    }

    #[test]
    fn g17_matches_redis_lua_number_conversion() {
        // Values measured on Redis 7.0 (SET from a script, then GET).
        assert_eq!(g17_string(0.1 + 0.2), "0.30000000000000004");
        assert_eq!(g17_string(1.0 / 3.0), "0.33333333333333331");
        assert_eq!(g17_string(1700000000123456.0), "1700000000123456");
        assert_eq!(g17_string(1700000000123456.5), "1700000000123456.5");
        assert_eq!(g17_string(2f64.powi(53) + 1.0), "9007199254740992");
        assert_eq!(g17_string(99.99999999999999), "99.999999999999986");
        assert_eq!(g17_string(1e21), "1e+21");
        assert_eq!(g17_string(-0.0), "-0");
        assert_eq!(g17_string(0.0), "0");
        assert_eq!(g17_string(-42.0), "-42");
        assert_eq!(g17_string(1e17), "1e+17");
        assert_eq!(g17_string(1e-5), "1.0000000000000001e-05");
    }

    #[test]
    fn eight_digit_groups_are_the_digits_of_the_number() {
        // Every number below 10^5 (every lane value of the last groups), then a stride through
        // the rest of 0..10^8 that meets every residue of the lanes, and the ends.
        let check = |n: u32| {
            assert_eq!(
                eight_ascii_digits(n),
                *format!("{n:08}").as_bytes().first_chunk::<8>().unwrap(),
                "{n}"
            );
        };
        (0..100_000).for_each(check);
        (0..100_000_000).step_by(9_973).for_each(check);
        for n in [
            99_999_999, 99_990_000, 10_000_000, 9_999_999, 12_345_678, 90_000_009,
        ] {
            check(n);
        }
    }

    #[test]
    fn integers_format_like_to_string() {
        for v in [
            0,
            7,
            -1,
            10,
            -10,
            1_764_560_000_123_456_789,
            i64::MAX,
            i64::MIN,
        ] {
            let mut buf = [0u8; G17_MAX_LEN];
            let len = format_i64(v, &mut buf);
            assert_eq!(&buf[..len], v.to_string().as_bytes());
        }
    }

    #[test]
    fn integers_of_every_length_format_and_parse_like_std() {
        // Every digit count and sign, then pseudo-random values (xorshift).
        let mut values: Vec<i64> = Vec::new();
        let mut p: i64 = 1;
        for _ in 0..19 {
            values.extend([p - 1, p, p + 1, -p, 9 * p, -(p - 1)]);
            p = p.saturating_mul(10);
        }
        let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
        for _ in 0..20_000 {
            let x = next();
            values.push((x >> (x % 64)) as i64);
        }
        for v in values {
            let mut buf = [0u8; G17_MAX_LEN];
            let len = format_i64(v, &mut buf);
            assert_eq!(&buf[..len], v.to_string().as_bytes());
            let text = v.to_string();
            let expected = (v.unsigned_abs() <= 1 << 53).then_some(v as f64);
            assert_eq!(small_integer(text.as_bytes()), expected, "{text}");
        }
    }

    #[test]
    fn the_fraction_fast_path_agrees_with_the_general_parser() {
        let same = |text: &str| {
            let general = text
                .parse::<f64>()
                .ok()
                .filter(|_| is_decimal(text.as_bytes()));
            assert_eq!(
                parse_decimal(text.as_bytes()).map(f64::to_bits),
                general.map(f64::to_bits),
                "{text}"
            );
        };
        for text in [
            "0.001",
            "1.",
            ".5",
            "-.5",
            "+2.5",
            "-0.0",
            "0.1",
            "0.3",
            "1000.75",
            ".",
            "-.",
            "1.5.2",
            "1.5e3",
            "1.e",
            "9007199254740.992",
            "9007199254740.993",
            "900719925474099.3",
            "0.0000000000000000001",
            "1234567890.123456789",
            "12345678901.23456789",
            "99.99999999999999",
            "0.30000000000000004",
            "1 .5",
            "1._5",
            "1.5 ",
        ] {
            same(text);
        }
        // Random digit strings with the point in every place, up to 21 digits (past the limit
        // of the fast path), and signs (xorshift).
        let mut next = xorshift(0x2545_F491_4F6C_DD1D);
        for _ in 0..50_000 {
            let len = (next() % 22) as usize;
            let mut text: String = (0..len)
                .map(|_| char::from(b'0' + (next() % 10) as u8))
                .collect();
            text.insert((next() as usize) % (len + 1), '.');
            match next() % 3 {
                0 => text.insert(0, '-'),
                1 => text.insert(0, '+'),
                _ => {}
            }
            same(&text);
        }
        assert_eq!(
            small_fraction(b"9007199254740.993"),
            None,
            "above 2^53 the general parser decides"
        );
        assert_eq!(small_fraction(b"0.001"), Some(0.001));
        assert_eq!(small_fraction(b"12"), None, "no point: the integer path's");
    }

    #[test]
    fn a_byte_that_is_not_a_digit_is_refused_in_any_position() {
        for len in 1..=19 {
            for at in 0..len {
                for bad in [b'/', b':', b' ', b'.', b'e', 0x00, 0x80, 0xB0, 0xFF] {
                    let mut text = vec![b'7'; len];
                    text[at] = bad;
                    assert_eq!(small_integer(&text), None, "{text:?}");
                }
            }
        }
        assert_eq!(eight_digits(*b"01234567"), Some(1_234_567));
        assert_eq!(eight_digits(*b"99999999"), Some(99_999_999));
    }

    fn printf_g17(value: f64) -> String {
        let mut buf = [0u8; 64];
        // SAFETY: buffer and size match; the format consumes one double.
        let n =
            unsafe { libc::snprintf(buf.as_mut_ptr().cast(), buf.len(), c"%.17g".as_ptr(), value) };
        String::from_utf8_lossy(&buf[..n as usize]).into_owned()
    }

    #[test]
    fn g17_layout_agrees_with_printf() {
        let mut values = vec![
            0.1,
            0.5,
            1.5,
            99.015,
            1e-4,
            1e-5,
            1e16,
            1e17,
            9.99999999999999e16,
            123456789012345678.0,
            5e-324,
            f64::MIN_POSITIVE,
            f64::MAX,
            -f64::MAX,
            1e300,
            1e-300,
            0.000123,
            12345.678,
            1.0 / 3.0,
            2.0 / 3.0,
            -0.0,
        ];
        // Powers of ten and their neighbours: where the decimal exponent changes.
        for p in -8..20 {
            let power = 10f64.powi(p);
            values.extend([
                power,
                f64::from_bits(power.to_bits() - 1),
                f64::from_bits(power.to_bits() + 1),
            ]);
        }
        // Pseudo-random: raw bit patterns, short binary fractions (whose exact decimal
        // expansions end in 5 and so hit rounding ties) and decimals of every magnitude.
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        for _ in 0..300_000 {
            let bits = next();
            values.push(f64::from_bits(bits));
            let small = (next() % (1 << 24)) as f64;
            values.push(small / 2f64.powi((next() % 80) as i32));
            values.push(small * 10f64.powi((next() % 60) as i32 - 30));
            values.push((next() % 1_000_000_000_000) as f64 / 1e6);
        }
        for v in values.into_iter().filter(|v| v.is_finite()) {
            assert_eq!(g17_string(v), printf_g17(v), "{v:e} ({:#x})", v.to_bits());
        }
    }
}
