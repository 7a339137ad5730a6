//! One output row as CSV text: msMemScope's columns, quoting, and the hand-rolled decimal and
//! hex formatting of the hot path.

use super::DeviceKey;

/// One output row; `id` is assigned by the writer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub event: &'static str,
    pub event_type: &'static str,
    /// Already formatted (`N/A`, or a quoted MSTX message); borrowed when constant.
    pub name: std::borrow::Cow<'static, str>,
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub device: DeviceKey,
    pub ptr: Option<u64>,
    /// The inside of the braces, e.g. `allocation_id:1,addr:0x...`; empty for no Attr.
    pub attr: String,
    /// The `Call Stack(C)` text (docs/call-stacks.md), when stacks are collected.
    pub c_stack: Option<std::sync::Arc<str>>,
    /// The `Call Stack(Python)` text (`file(line): function` lines, `--call-stack=python`).
    pub py_stack: Option<std::sync::Arc<str>>,
}

impl Row {
    /// The CSV line for this row with ID `id`, newline included.
    pub fn format(&self, id: u64) -> String {
        let mut line = Vec::with_capacity(160);
        self.format_into(id, &mut line);
        String::from_utf8(line).expect("rows are UTF-8")
    }

    /// Appends the CSV line to `out` without temporaries (the hot path of every row).
    pub fn format_into(&self, id: u64, out: &mut Vec<u8>) {
        push_u64(out, id);
        out.push(b',');
        out.extend_from_slice(self.event.as_bytes());
        out.push(b',');
        out.extend_from_slice(self.event_type.as_bytes());
        out.push(b',');
        out.extend_from_slice(self.name.as_bytes());
        out.push(b',');
        push_u64(out, self.ts_ns);
        out.push(b',');
        push_u64(out, self.pid as u64);
        out.push(b',');
        push_u64(out, self.tid as u64);
        out.push(b',');
        match self.device {
            DeviceKey::Npu(n) => push_u64(out, n as u64),
            DeviceKey::Cpu => out.extend_from_slice(b"cpu"),
            DeviceKey::NotApplicable => out.extend_from_slice(b"N/A"),
        }
        out.push(b',');
        match self.ptr {
            Some(p) => push_hex16(out, p),
            None => out.extend_from_slice(b"N/A"),
        }
        out.push(b',');
        if !self.attr.is_empty() {
            out.extend_from_slice(b"\"{");
            out.extend_from_slice(self.attr.as_bytes());
            out.extend_from_slice(b"}\"");
        }
        out.push(b',');
        push_quoted(out, self.py_stack.as_deref());
        out.push(b',');
        push_quoted(out, self.c_stack.as_deref());
        out.push(b'\n');
    }
}

/// A stack column: quoted (it holds newlines), quotes doubled; nothing when there is none.
pub(super) fn push_quoted(out: &mut Vec<u8>, text: Option<&str>) {
    if let Some(st) = text {
        out.push(b'"');
        for part in st.split('"').enumerate() {
            if part.0 > 0 {
                out.extend_from_slice(b"\"\"");
            }
            out.extend_from_slice(part.1.as_bytes());
        }
        out.push(b'"');
    }
}

/// "00" to "99": two decimal digits per table lookup.
pub(super) const DEC_PAIRS: &[u8; 200] = b"\
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
pub(super) const HEX_PAIRS: [[u8; 2]; 256] = {
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

/// Quotes a free-text field (an MSTX message) the way msMemScope does, `"..."`, doubling any
/// quote inside so CSV readers still split the row correctly.
pub fn quote_text(s: &str) -> String {
    let clean: String = s
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    format!("\"{}\"", clean.replace('"', "\"\""))
}
