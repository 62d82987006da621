//! Numbers on both sides of the store: `format_g17` must print exactly what C's `%.17g` prints
//! (Redis's conversion of a Lua number), and the parsers must read exactly what C's `strtod`
//! reads (Lua's `tonumber`) for every string the grammar accepts, and accept nothing longer than
//! `MAX_NUMBER_LEN` bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redis_rate_limiter::codec::number::{
    G17_MAX_LEN, MAX_NUMBER_LEN, format_g17, is_decimal, is_integer, parse_decimal, parse_integer,
};

fn printf_g17(value: f64) -> Vec<u8> {
    let mut buf = [0u8; 64];
    // SAFETY: buffer and size match; the format consumes one double.
    let n = unsafe { libc::snprintf(buf.as_mut_ptr().cast(), buf.len(), c"%.17g".as_ptr(), value) };
    buf[..n as usize].to_vec()
}

fn strtod(text: &[u8]) -> f64 {
    let owned = std::ffi::CString::new(text).unwrap();
    // SAFETY: a NUL-terminated string; the end pointer is not needed.
    unsafe { libc::strtod(owned.as_ptr(), std::ptr::null_mut()) }
}

fuzz_target!(|data: &[u8]| {
    if let Some(bits) = data.get(..8) {
        let value = f64::from_bits(u64::from_le_bytes(bits.try_into().unwrap()));
        if value.is_finite() {
            let mut buf = [0u8; G17_MAX_LEN];
            let len = format_g17(value, &mut buf);
            assert_eq!(&buf[..len], &printf_g17(value)[..], "{value:e}");
            // %.17g always reads back as the same double.
            assert_eq!(parse_decimal(&buf[..len]).map(f64::to_bits), Some(value.to_bits()));
        }
    }
    if data.len() > MAX_NUMBER_LEN {
        assert!(!is_decimal(data) && !is_integer(data));
        assert_eq!((parse_decimal(data), parse_integer(data)), (None, None));
    }
    if !data.contains(&0) && is_decimal(data) {
        let ours = parse_decimal(data).unwrap();
        assert_eq!(ours.to_bits(), strtod(data).to_bits(), "{:?}", String::from_utf8_lossy(data));
    }
});
