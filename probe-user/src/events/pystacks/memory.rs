//! Reading the traced process's memory (read only, `/proc/PID/mem`): code objects, their
//! names and line tables, cached by address.

use super::layouts::{BYTES_DATA, OB_SIZE, OB_TYPE, PyLayout, STR_LENGTH, STR_STATE};
use super::{CodeEntry, PyProc};
use anyhow::{Context, Result, bail};
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

impl PyProc {
    /// The code object at `addr`, if it is still the one whose identity BPF read at the call
    /// (`ids`): a cached entry of another identity was freed and replaced since it was read,
    /// and is read again; a code object read now of another identity is not the one that ran.
    pub(super) fn code(&mut self, addr: u64, ids: Option<u64>) -> Option<Arc<CodeEntry>> {
        let same = |c: &Arc<CodeEntry>| ids.is_none_or(|ids| c.info.ids == ids);
        if let Some(Some(c)) = self.codes.get(&addr)
            && same(c)
        {
            return Some(c.clone());
        }
        let entry = read_code(&self.mem, &self.layout, self.code_type, addr)
            .map_err(|e| crate::log::debug(&format!("pid {}: Python frame: {e:#}", self.pid)))
            .ok()
            .map(|info| {
                Arc::new(CodeEntry {
                    file: Arc::from(info.filename.as_str()),
                    function: Arc::from(info.name.as_str()),
                    info,
                })
            });
        // Failures are not cached: a later read may succeed.
        if entry.is_some() {
            self.codes.insert(addr, entry.clone());
        }
        entry.filter(same)
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
