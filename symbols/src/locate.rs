//! Finding code in a stripped object by what it does rather than by its name.
//!
//! Some code worth probing is neither exported nor named in a symbol table (a vendor library
//! shipped without `.symtab`). What such an object always keeps is enough to find it again in
//! every build: the string literals its functions use (log messages), the instructions that
//! load those strings, the bounds of every function in the unwind tables (`.eh_frame_hdr`),
//! and the direct calls between functions. [`Image`] answers those questions about one file;
//! the knowledge of *which* strings and patterns matter belongs to the caller.
//!
//! Instruction scans here are x86-64 byte patterns (a `lea`/`mov` with a RIP-relative operand,
//! a `call rel32`); they may find a few false candidates, never miss a real one, so callers
//! confirm each candidate (by function bounds, decoding, counts) before trusting it.

use std::{fs, path::Path};

use anyhow::{Context, Result, bail};
use gimli::{BaseAddresses, EhFrame, NativeEndian, UnwindSection};
use object::{Object, ObjectSection, read::elf::ElfFile64};

/// A section of the image: name, address as linked, and its bytes' place in the file.
#[derive(Clone, Debug)]
struct Section {
    name: String,
    address: u64,
    offset: usize,
    size: usize,
}

/// One ELF object's bytes and section table.
pub struct Image {
    data: Vec<u8>,
    sections: Vec<Section>,
}

impl Image {
    /// Reads the object at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let data = fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        Self::parse(data).with_context(|| format!("cannot parse ELF file {}", path.display()))
    }

    /// Parses an in-memory image. Never panics on malformed input.
    pub fn parse(data: Vec<u8>) -> Result<Self> {
        let sections = {
            let file = ElfFile64::<object::Endianness>::parse(&data[..])?;
            file.sections()
                .filter_map(|s| {
                    let (offset, size) = s.file_range()?;
                    let end = offset.checked_add(size)?;
                    (end <= data.len() as u64).then(|| Section {
                        name: s.name().unwrap_or_default().to_owned(),
                        address: s.address(),
                        offset: offset as usize,
                        size: size as usize,
                    })
                })
                .collect()
        };
        Ok(Image { data, sections })
    }

    fn section(&self, name: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.name == name)
    }

    fn bytes(&self, s: &Section) -> &[u8] {
        &self.data[s.offset..s.offset + s.size]
    }

    /// The bytes of the named section and its address.
    pub fn section_data(&self, name: &str) -> Option<(u64, &[u8])> {
        self.section(name).map(|s| (s.address, self.bytes(s)))
    }

    /// The file offset of a linked address (what a uprobe attaches to).
    pub fn file_offset(&self, address: u64) -> Option<u64> {
        self.sections
            .iter()
            .find(|s| s.address != 0 && address >= s.address && address - s.address < s.size as u64)
            .map(|s| s.offset as u64 + (address - s.address))
    }

    /// `len` bytes of code at a linked address.
    pub fn code(&self, address: u64, len: u64) -> Option<&[u8]> {
        let start = self.file_offset(address)? as usize;
        let end = start.checked_add(len as usize)?;
        self.data.get(start..end)
    }

    /// Addresses of the NUL-terminated strings in `.rodata` that contain `needle`, each the
    /// address of its string's first byte (what code loads).
    pub fn strings_containing(&self, needle: &[u8]) -> Vec<u64> {
        let Some(rodata) = self.section(".rodata") else {
            return Vec::new();
        };
        let bytes = self.bytes(rodata);
        let mut found = Vec::new();
        let mut from = 0;
        while let Some(at) = find(&bytes[from..], needle) {
            let hit = from + at;
            let start = bytes[..hit]
                .iter()
                .rposition(|b| *b == 0)
                .map_or(0, |nul| nul + 1);
            found.push(rodata.address + start as u64);
            from = hit + needle.len().max(1);
        }
        found.dedup();
        found
    }

    /// Addresses of the instructions in `.text` that compute or load `target` RIP-relatively
    /// (`lea`/`mov r64, [rip + disp32]`, with a REX.W prefix).
    pub fn rip_relative_refs(&self, target: u64) -> Vec<u64> {
        let Some(text) = self.section(".text") else {
            return Vec::new();
        };
        let code = self.bytes(text);
        let mut refs = Vec::new();
        for i in 0..code.len().saturating_sub(7) {
            let (rex, opcode, modrm) = (code[i], code[i + 1], code[i + 2]);
            if rex & 0xf8 != 0x48 || !(opcode == 0x8d || opcode == 0x8b) || modrm & 0xc7 != 0x05 {
                continue;
            }
            let disp = i32::from_le_bytes([code[i + 3], code[i + 4], code[i + 5], code[i + 6]]);
            let next = text.address + i as u64 + 7;
            if next.wrapping_add(disp as i64 as u64) == target {
                refs.push(text.address + i as u64);
            }
        }
        refs
    }

    /// Addresses of the `call rel32` instructions in `.text` whose target is `target`.
    pub fn direct_calls_to(&self, target: u64) -> Vec<u64> {
        let Some(text) = self.section(".text") else {
            return Vec::new();
        };
        let code = self.bytes(text);
        let mut calls = Vec::new();
        for i in 0..code.len().saturating_sub(5) {
            if code[i] != 0xe8 {
                continue;
            }
            let rel = i32::from_le_bytes([code[i + 1], code[i + 2], code[i + 3], code[i + 4]]);
            let next = text.address + i as u64 + 5;
            if next.wrapping_add(rel as i64 as u64) == target {
                calls.push(text.address + i as u64);
            }
        }
        calls
    }

    /// The function containing `pc`, as `(start, length)`, from the unwind tables'
    /// binary-search index (`.eh_frame_hdr`) and the FDE it points to.
    pub fn function_bounds(&self, pc: u64) -> Option<(u64, u64)> {
        let hdr = self.section(".eh_frame_hdr")?;
        let eh = self.section(".eh_frame")?;
        let h = self.bytes(hdr);
        // version 1; eh_frame_ptr: any 4-byte encoding; fde_count: udata4; table: datarel sdata4
        if h.len() < 12 || h[0] != 1 || h[2] != 0x03 || h[3] != 0x3b || h[1] & 0x0f != 0x0b {
            return None;
        }
        let count = u32::from_le_bytes(h[8..12].try_into().ok()?) as usize;
        let table = h.get(12..12 + count.checked_mul(8)?)?;
        let entry = |i: usize| -> (u64, u64) {
            let e = &table[i * 8..i * 8 + 8];
            let loc = i32::from_le_bytes(e[0..4].try_into().unwrap()) as i64;
            let fde = i32::from_le_bytes(e[4..8].try_into().unwrap()) as i64;
            (
                hdr.address.wrapping_add(loc as u64),
                hdr.address.wrapping_add(fde as u64),
            )
        };
        // The last entry whose initial location is at or below pc.
        let (mut lo, mut hi) = (0, count);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if entry(mid).0 <= pc {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let (_, fde_addr) = entry(lo.checked_sub(1)?);
        let eh_frame = EhFrame::new(self.bytes(eh), NativeEndian);
        let bases = BaseAddresses::default()
            .set_eh_frame(eh.address)
            .set_eh_frame_hdr(hdr.address)
            .set_text(self.section(".text").map_or(0, |t| t.address));
        let offset = gimli::EhFrameOffset(fde_addr.checked_sub(eh.address)? as usize);
        let fde = eh_frame
            .fde_from_offset(&bases, offset, EhFrame::cie_from_offset)
            .ok()?;
        (pc >= fde.initial_address() && pc - fde.initial_address() < fde.len())
            .then(|| (fde.initial_address(), fde.len()))
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || needle.len() > haystack.len() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Fails unless `what` holds exactly one element, which it returns.
pub fn exactly_one<T: Copy + std::fmt::Debug>(what: &str, items: &[T]) -> Result<T> {
    match items {
        [one] => Ok(*one),
        [] => bail!("no {what} found"),
        many => bail!("{} candidates for {what}: {many:x?}", many.len()),
    }
}
