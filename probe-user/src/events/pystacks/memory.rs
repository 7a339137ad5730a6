//! Code objects, their names and line tables: as BPF sent them at first sight, else read from
//! the traced process's memory (read only, `/proc/PID/mem`); cached by address and identity.

use super::layouts::{BYTES_DATA, OB_SIZE, OB_TYPE, PyLayout, STR_LENGTH, STR_STATE};
use super::{CodeEntry, PyProc};
use anyhow::{Context, Result, bail};
use probe_common::{
    PY_CODE_FILE, PY_CODE_HEADER, PY_CODE_NAME, PY_CODE_TABLE, PYCODE_KIND, PyCodeEvent,
    py_code_flags,
};
use std::sync::Arc;
use std::{fs::File, os::unix::fs::FileExt};

/// A code object as read from the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeInfo {
    pub filename: String,
    pub name: String,
    pub qualname: String,
    pub firstlineno: i32,
    pub linetable: Vec<u8>,
    /// Address of the first instruction.
    pub code_start: u64,
    /// [`probe_common::py_code_ids`] of its name, file and line table pointers.
    pub ids: u64,
}

impl CodeInfo {
    /// The source line of the instruction at `instr` (an address into this code object's
    /// instructions), as `PyCode_Addr2Line` computes it; `None` for "no line".
    pub fn line_at(&self, instr: u64) -> Option<i32> {
        if instr < self.code_start {
            return Some(self.firstlineno);
        }
        line_for_offset(&self.linetable, self.firstlineno, instr - self.code_start)
    }
}

/// The line of byte offset `offset` into the instructions, from a 3.11+ location table: a
/// sequence of entries, each starting with a byte `1 CCCC LLL` (code, length - 1 in code
/// units), followed by code-specific varints; codes 13 and 14 carry a signed line delta,
/// 10-12 a delta of 0-2, 15 means "no line", 0-9 the same line.
pub fn line_for_offset(table: &[u8], firstlineno: i32, offset: u64) -> Option<i32> {
    let mut line = firstlineno as i64;
    let mut end: u64 = 0;
    let mut i = 0;
    while i < table.len() {
        let head = table[i];
        if head & 0x80 == 0 {
            // Not an entry start: a corrupt table (or one we misread).
            return None;
        }
        let code = (head >> 3) & 15;
        let units = (head & 7) as u64 + 1;
        let delta = match code {
            13 | 14 => signed_varint(table.get(i + 1..)?)?,
            10..=12 => (code - 10) as i64,
            _ => 0,
        };
        line += delta;
        end += units * 2;
        if offset < end {
            return if code == 15 { None } else { Some(line as i32) };
        }
        i += 1;
        while i < table.len() && table[i] & 0x80 == 0 {
            i += 1;
        }
    }
    None
}

/// Location-table varints: 6 bits per byte, least significant first, 0x40 = more follow.
pub(super) fn varint(bytes: &[u8]) -> Option<u64> {
    let mut v: u64 = 0;
    for (k, b) in bytes.iter().enumerate().take(10) {
        v |= ((b & 0x3f) as u64) << (6 * k);
        if b & 0x40 == 0 {
            return Some(v);
        }
    }
    None
}

pub(super) fn signed_varint(bytes: &[u8]) -> Option<i64> {
    let v = varint(bytes)?;
    Some(if v & 1 != 0 {
        -((v >> 1) as i64)
    } else {
        (v >> 1) as i64
    })
}

/// A code object as BPF sent it at its first sight in a process ([`PyCodeEvent`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeRecord {
    pub pid: u32,
    pub code: u64,
    pub ids: u64,
    pub flags: u16,
    pub filename: String,
    pub name: String,
    pub qualname: String,
    pub firstlineno: i32,
    pub linetable: Vec<u8>,
    /// The whole line table is here (else only its start: `py_code_flags::CUT`).
    pub table_complete: bool,
}

/// Parses a PYCODE record; `None` for anything else.
pub fn code_record_from_bytes(bytes: &[u8]) -> Option<CodeRecord> {
    use std::mem::offset_of;
    if bytes.len() < PY_CODE_HEADER || u16::from_ne_bytes([bytes[0], bytes[1]]) != PYCODE_KIND {
        return None;
    }
    let u16_at = |o: usize| u16::from_ne_bytes([bytes[o], bytes[o + 1]]);
    let u32_at = |o: usize| u32::from_ne_bytes(bytes[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_ne_bytes(bytes[o..o + 8].try_into().unwrap());
    let name = |at: usize, room: usize, len: usize, kind: usize| {
        let len = (u16_at(len) as usize).min(room);
        text(&bytes[at..at + len], bytes[kind])
    };
    let table_len = (u32_at(offset_of!(PyCodeEvent, table_len)) as usize)
        .min(PY_CODE_TABLE)
        .min(bytes.len() - PY_CODE_HEADER);
    let full = u32_at(offset_of!(PyCodeEvent, table_full_len)) as usize;
    Some(CodeRecord {
        pid: u32_at(offset_of!(PyCodeEvent, pid)),
        code: u64_at(offset_of!(PyCodeEvent, code)),
        ids: u64_at(offset_of!(PyCodeEvent, ids)),
        flags: u16_at(offset_of!(PyCodeEvent, flags)),
        filename: name(
            offset_of!(PyCodeEvent, file),
            PY_CODE_FILE,
            offset_of!(PyCodeEvent, file_len),
            offset_of!(PyCodeEvent, file_kind),
        ),
        name: name(
            offset_of!(PyCodeEvent, name),
            PY_CODE_NAME,
            offset_of!(PyCodeEvent, name_len),
            offset_of!(PyCodeEvent, name_kind),
        ),
        qualname: name(
            offset_of!(PyCodeEvent, qualname),
            PY_CODE_NAME,
            offset_of!(PyCodeEvent, qualname_len),
            offset_of!(PyCodeEvent, qualname_kind),
        ),
        firstlineno: u32_at(offset_of!(PyCodeEvent, firstlineno)) as i32,
        linetable: bytes[PY_CODE_HEADER..PY_CODE_HEADER + table_len].to_vec(),
        table_complete: table_len == full,
    })
}

/// The characters of a compact `str` (`kind`: bytes per character).
fn text(bytes: &[u8], kind: u8) -> String {
    match kind {
        2 => bytes
            .chunks_exact(2)
            .map(|c| char::from_u32(u16::from_le_bytes([c[0], c[1]]) as u32).unwrap_or('?'))
            .collect(),
        4 => bytes
            .chunks_exact(4)
            .map(|c| char::from_u32(u32::from_le_bytes(c.try_into().unwrap())).unwrap_or('?'))
            .collect(),
        _ => bytes.iter().map(|&b| b as char).collect(),
    }
}

/// Lines remembered per process before the memo starts over (a few MB at most).
const LINES_KEPT: usize = 1 << 16;

impl PyProc {
    /// Takes a code object BPF sent at first sight. A record with a name it could not read
    /// is left out: the code object is read from the process instead, as before.
    pub(super) fn learn(&mut self, r: CodeRecord) {
        if r.flags & py_code_flags::NAME_UNREADABLE != 0
            || r.flags & py_code_flags::TABLE_UNREADABLE != 0
        {
            return;
        }
        // A name longer than BPF's room (its line table whole, yet cut): read whole now, while
        // the code object is most likely alive; the cut one if it is gone.
        if r.flags & py_code_flags::CUT != 0
            && r.table_complete
            && let Some(whole) = self.read_code(r.code).filter(|w| w.info.ids == r.ids)
        {
            self.codes.insert((r.code, r.ids), whole);
            return;
        }
        let info = CodeInfo {
            filename: r.filename,
            name: r.name,
            qualname: r.qualname,
            firstlineno: r.firstlineno,
            linetable: r.linetable,
            code_start: r.code + self.layout.code.code_adaptive,
            ids: r.ids,
        };
        self.codes.insert(
            (r.code, r.ids),
            Arc::new(CodeEntry {
                file: Arc::from(info.filename.as_str()),
                function: Arc::from(info.name.as_str()),
                complete: r.table_complete,
                info,
            }),
        );
    }

    /// The code object at `addr` with the identity BPF read at the call (`ids`): the one BPF
    /// sent at first sight, else read from the process now, if it is still that one (a code
    /// object read now of another identity is not the one that ran).
    pub(super) fn code(&mut self, addr: u64, ids: Option<u64>) -> Option<Arc<CodeEntry>> {
        if let Some(ids) = ids
            && let Some(c) = self.codes.get(&(addr, ids))
        {
            return Some(c.clone());
        }
        let entry = self.read_code(addr)?;
        // Failures are not cached: a later read may succeed.
        let ids = ids.unwrap_or(entry.info.ids);
        if entry.info.ids != ids {
            return None;
        }
        self.codes.insert((addr, ids), entry.clone());
        Some(entry)
    }

    /// The line of `instr` in a code object; a line table BPF had to cut is read whole from
    /// the process when the line lies past the part it sent (while it is still the same).
    /// Remembered per (code object, instruction) once known: a failed read of the whole table
    /// is not (a later read may succeed).
    pub(super) fn line(&mut self, c: &Arc<CodeEntry>, addr: u64, instr: u64) -> Option<i32> {
        let key = (addr, c.info.ids, instr);
        if let Some(line) = self.lines.get(&key) {
            return *line;
        }
        let mut line = c.info.line_at(instr);
        if line.is_none() && !c.complete {
            let whole = self.read_code(addr).filter(|w| w.info.ids == c.info.ids)?;
            self.codes.insert((addr, c.info.ids), whole.clone());
            line = whole.info.line_at(instr);
        }
        if self.lines.len() >= LINES_KEPT {
            self.lines.clear();
        }
        self.lines.insert(key, line);
        line
    }

    fn read_code(&self, addr: u64) -> Option<Arc<CodeEntry>> {
        read_code(&self.mem, &self.layout, self.code_type, addr)
            .map_err(|e| crate::log::debug(&format!("pid {}: Python frame: {e:#}", self.pid)))
            .ok()
            .map(|info| {
                Arc::new(CodeEntry {
                    file: Arc::from(info.filename.as_str()),
                    function: Arc::from(info.name.as_str()),
                    complete: true,
                    info,
                })
            })
    }
}

pub(super) fn read_at(mem: &File, addr: u64, len: usize) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    mem.read_exact_at(&mut buf, addr)
        .with_context(|| format!("cannot read {len} bytes at 0x{addr:x}"))?;
    Ok(buf)
}

pub(super) fn u64_in(b: &[u8], off: u64) -> u64 {
    let o = off as usize;
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// Reads a code object: checks its type, then its names, first line and line table.
pub fn read_code(mem: &File, layout: &PyLayout, code_type: u64, addr: u64) -> Result<CodeInfo> {
    let c = &layout.code;
    let head = read_at(mem, addr, (c.linetable + 8) as usize)?;
    // A freed block's first word is often an allocator's free-list pointer (pymalloc keeps
    // the type word, glibc's tcache overwrites it too): not a live object. (A block freed
    // last in its pool holds 0 there and still reads as it was: the identity check in
    // `PyProc::code` catches a new code object made in it.)
    if u64_in(&head, 0) >= 1 << 40 {
        bail!("0x{addr:x} was freed");
    }
    let ty = u64_in(&head, OB_TYPE);
    if ty != code_type {
        bail!("0x{addr:x} is not a code object (type 0x{ty:x}, not 0x{code_type:x})");
    }
    let firstlineno = u64_in(&head, c.firstlineno) as u32 as i32;
    let filename = read_str(mem, layout, u64_in(&head, c.filename))?;
    let name = read_str(mem, layout, u64_in(&head, c.name))?;
    let qualname = read_str(mem, layout, u64_in(&head, c.qualname)).unwrap_or_default();
    let linetable = read_bytes(mem, u64_in(&head, c.linetable))?;
    Ok(CodeInfo {
        filename,
        name,
        qualname,
        firstlineno,
        linetable,
        code_start: addr + c.code_adaptive,
        ids: probe_common::py_code_ids(
            [c.filename, c.name, c.qualname, c.linetable].map(|off| u64_in(&head, off)),
        ),
    })
}

/// A `bytes` object's contents (at most 1 MiB).
pub(super) fn read_bytes(mem: &File, addr: u64) -> Result<Vec<u8>> {
    let head = read_at(mem, addr, BYTES_DATA as usize)?;
    let len = u64_in(&head, OB_SIZE);
    if len > 1 << 20 {
        bail!("bytes object of {len} bytes");
    }
    read_at(mem, addr + BYTES_DATA, len as usize)
}

/// A compact `str` object's text (at most 64 KiB of characters).
pub(super) fn read_str(mem: &File, layout: &PyLayout, addr: u64) -> Result<String> {
    let head = read_at(mem, addr, (STR_STATE + 4) as usize)?;
    let len = u64_in(&head, STR_LENGTH);
    let state = u32::from_le_bytes(head[STR_STATE as usize..][..4].try_into().unwrap());
    let kind = (state >> 2) & 7;
    let compact = (state >> 5) & 1 != 0;
    let ascii = (state >> 6) & 1 != 0;
    if !compact || len > 1 << 16 {
        bail!("unsupported str object at 0x{addr:x}");
    }
    let data = if ascii {
        addr + layout.ascii_size
    } else {
        addr + layout.compact_size
    };
    let bytes = read_at(mem, data, len as usize * kind.max(1) as usize)?;
    Ok(match kind {
        1 => bytes.iter().map(|&b| b as char).collect(),
        2 => bytes
            .chunks_exact(2)
            .map(|c| char::from_u32(u16::from_le_bytes([c[0], c[1]]) as u32).unwrap_or('?'))
            .collect(),
        4 => bytes
            .chunks_exact(4)
            .map(|c| char::from_u32(u32::from_le_bytes(c.try_into().unwrap())).unwrap_or('?'))
            .collect(),
        _ => bail!("str object of kind {kind} at 0x{addr:x}"),
    })
}
