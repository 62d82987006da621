//! Numbers written into strings without the formatting machinery: the per-request paths (keys,
//! batch signatures, response fields) write several for every request.

/// `v` in decimal, as `{}` writes it.
pub(crate) fn push_u64(out: &mut String, v: u64) {
    push_digits(out, v, 10);
}

/// `v` in lowercase hexadecimal, as `{:x}` writes it.
pub(crate) fn push_hex(out: &mut String, v: u64) {
    push_digits(out, v, 16);
}

fn push_digits(out: &mut String, mut v: u64, radix: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    // 20 digits hold any u64 in decimal, 16 in hexadecimal; written from the end.
    let mut buf = [0u8; 20];
    let mut start = buf.len();
    for slot in buf.iter_mut().rev() {
        *slot = DIGITS.get((v % radix) as usize).copied().unwrap_or(b'0');
        start -= 1;
        v /= radix;
        if v == 0 {
            break;
        }
    }
    if let Some(Ok(digits)) = buf.get(start..).map(std::str::from_utf8) {
        out.push_str(digits);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn as_the_formatter_writes_them() {
        let mut values = vec![0, 1, 9, 10, 15, 16, 99, 100, 255, 256, 1_000_000, u64::MAX];
        values.extend((0..64).map(|i| 1u64 << i));
        values.extend((0..64).map(|i| (1u64 << i) - 1));
        values.extend([1.5f64, 0.001, 1e9, f64::MAX].map(f64::to_bits));
        for v in values {
            let (mut d, mut h) = (String::from("x"), String::new());
            push_u64(&mut d, v);
            push_hex(&mut h, v);
            assert_eq!(d, format!("x{v}"));
            assert_eq!(h, format!("{v:x}"));
        }
    }
}
