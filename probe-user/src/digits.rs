//! Decimal and hex digits written straight into a byte buffer, the hot path of every row:
//! shared by the rows `state` builds (the Attr text) and the lines `output` writes.

/// "00" to "99": two decimal digits per table lookup.
const DEC_PAIRS: &[u8; 200] = b"\
0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// Decimal digits of `v`, written straight into `out`'s spare capacity (the digit count is
/// known up front, so the digits go to their final place, two per step, with no temporary
/// buffer and no `memcpy` call).
#[inline]
pub fn push_u64(out: &mut Vec<u8>, mut v: u64) {
    let n = v.checked_ilog10().unwrap_or(0) as usize + 1;
    out.reserve(n);
    // SAFETY: `n` bytes are reserved past `len`; the loop writes exactly the `n` digits of
    // `v` into them, from the last one back, before `set_len` exposes them.
    unsafe {
        let start = out.as_mut_ptr().add(out.len());
        let mut end = start.add(n);
        while v >= 100 {
            let d = (v % 100) as usize * 2;
            v /= 100;
            end = end.sub(2);
            std::ptr::copy_nonoverlapping(DEC_PAIRS.as_ptr().add(d), end, 2);
        }
        if v >= 10 {
            end = end.sub(2);
            std::ptr::copy_nonoverlapping(DEC_PAIRS.as_ptr().add(v as usize * 2), end, 2);
        } else {
            end = end.sub(1);
            *end = b'0' + v as u8;
        }
        debug_assert_eq!(end, start);
        out.set_len(out.len() + n);
    }
}

/// Each byte value as two lowercase hex digits.
const HEX_PAIRS: [[u8; 2]; 256] = {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut t = [[0u8; 2]; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = [HEX[i >> 4], HEX[i & 0xf]];
        i += 1;
    }
    t
};

/// `0x` and 16 lowercase hex digits.
#[inline]
pub fn push_hex16(out: &mut Vec<u8>, v: u64) {
    let mut buf = *b"0x0000000000000000";
    for (k, b) in v.to_be_bytes().iter().enumerate() {
        let pair = HEX_PAIRS[*b as usize];
        buf[2 + 2 * k] = pair[0];
        buf[3 + 2 * k] = pair[1];
    }
    out.extend_from_slice(&buf);
}
