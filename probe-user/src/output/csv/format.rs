//! One output row as CSV text: msMemScope's columns, quoting, and the hand-rolled decimal and
//! hex formatting of the hot path.

use crate::digits::{push_hex16, push_u64};
use crate::state::{DeviceKey, Row};

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
