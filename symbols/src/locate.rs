//! Finding code in a stripped object by what it does rather than by its name.
//!
//! Some code worth probing is neither exported nor named in a symbol table (a vendor library
//! shipped without `.symtab`). What such an object always keeps is enough to find it again in
//! every build: the string literals its functions use (log messages), the instructions that
//! load those strings, the bounds of every function in the unwind tables (`.eh_frame_hdr`),
//! and the direct calls between functions. [`Image`] answers those questions about one file;
//! the knowledge of *which* strings and patterns matter belongs to the caller.
//!
//! How a release was built must not matter: strings are looked for in every read-only data
//! section (GNU ld merges literals into `.rodata`, mold keeps `.rodata.str1.8` and friends),
//! code in every executable section, and every address goes through the section table (mold
//! lays code out 0x1000 away from its file offset). The instruction-level questions go to the
//! object's instruction set behind [`Isa`] (x86-64 in [`x86_64`], A64 in [`aarch64`]; one module
//! per architecture),
//! so the search above it is the same for each. Scans may find a few false candidates, never
//! miss a real one, so callers confirm each candidate (by function bounds, decoding, counts)
//! before trusting it.

mod aarch64;
mod x86_64;

use std::{fs, path::Path};

use anyhow::{Context, Result, bail};
use gimli::{BaseAddresses, EhFrame, NativeEndian, UnwindSection};
use object::{
    Architecture, Object, ObjectSection, ObjectSymbol, SectionKind, SymbolKind,
    read::elf::ElfFile64,
};

/// A section of the image: name, address as linked, its bytes' place in the file and kind.
#[derive(Clone, Debug)]
struct Section {
    name: String,
    address: u64,
    offset: usize,
    size: usize,
    kind: SectionKind,
}

/// One ELF object's bytes and section table.
pub struct Image {
    data: Vec<u8>,
    sections: Vec<Section>,
    architecture: Architecture,
}

/// A constant (or unknown) byte written to memory at `base register + offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteStore {
    /// The base register, numbered by the instruction set's module.
    pub base: u32,
    pub offset: i64,
    /// `None` when the stored value is not a known constant.
    pub value: Option<u8>,
    /// How many bytes the instruction that wrote it stored.
    pub width: u8,
}

/// A direct call and the byte stores since the previous call (the argument it was given), in
/// program order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallSite {
    pub at: u64,
    pub target: u64,
    pub stores: Vec<ByteStore>,
}

/// What the search needs from one instruction set. `code` is linked at `address`.
pub trait Isa {
    /// The instructions that put `target` (a string's address) in a register.
    fn address_loads(&self, code: &[u8], address: u64, target: u64) -> Vec<u64>;
    /// The direct calls of `target`.
    fn direct_calls(&self, code: &[u8], address: u64, target: u64) -> Vec<u64>;
    /// The direct calls of one function (its whole code), each with its stores.
    fn call_sites(&self, code: &[u8], address: u64) -> Vec<CallSite>;
    /// The direct jumps (conditional or not) to `target`: tail calls, which reach a function
    /// without a call instruction.
    fn direct_jumps(&self, code: &[u8], address: u64, target: u64) -> Vec<u64>;
}

impl Image {
    /// Reads the object at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let data = fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        Self::parse(data).with_context(|| format!("cannot parse ELF file {}", path.display()))
    }

    /// Parses an in-memory image. Never panics on malformed input.
    pub fn parse(data: Vec<u8>) -> Result<Self> {
        let (sections, architecture) = {
            let file = ElfFile64::<object::Endianness>::parse(&data[..])?;
            let sections = file
                .sections()
                .filter_map(|s| {
                    let (offset, size) = s.file_range()?;
                    let end = offset.checked_add(size)?;
                    (end <= data.len() as u64).then(|| Section {
                        name: s.name().unwrap_or_default().to_owned(),
                        address: s.address(),
                        offset: offset as usize,
                        size: size as usize,
                        kind: s.kind(),
                    })
                })
                .collect();
            (sections, file.architecture())
        };
        Ok(Image {
            data,
            sections,
            architecture,
        })
    }

    /// The decoder of this object's instruction set, or why there is none.
    pub fn isa(&self) -> Result<&'static dyn Isa> {
        match self.architecture {
            Architecture::X86_64 => Ok(&x86_64::X86_64),
            Architecture::Aarch64 => Ok(&aarch64::Aarch64),
            other => bail!("no instruction decoder for {other:?} code yet"),
        }
    }

    /// The sections holding code, with their addresses.
    fn code_sections(&self) -> impl Iterator<Item = (u64, &[u8])> {
        self.sections
            .iter()
            .filter(|s| s.kind == SectionKind::Text && s.address != 0)
            .map(|s| (s.address, self.bytes(s)))
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

    /// Addresses of the NUL-terminated strings in any read-only data section that contain
    /// `needle`, each the address of its string's first byte (what code loads), sorted.
    pub fn strings_containing(&self, needle: &[u8]) -> Vec<u64> {
        let mut found = Vec::new();
        for section in self.sections.iter().filter(|s| {
            s.address != 0
                && matches!(
                    s.kind,
                    SectionKind::ReadOnlyData | SectionKind::ReadOnlyString
                )
        }) {
            let bytes = self.bytes(section);
            let mut from = 0;
            while let Some(at) = find(&bytes[from..], needle) {
                let hit = from + at;
                let start = bytes[..hit]
                    .iter()
                    .rposition(|b| *b == 0)
                    .map_or(0, |nul| nul + 1);
                found.push(section.address + start as u64);
                from = hit + needle.len().max(1);
            }
        }
        found.sort_unstable();
        found.dedup();
        found
    }

    /// Addresses of the instructions that put `target` in a register.
    pub fn address_loads(&self, target: u64) -> Result<Vec<u64>> {
        let isa = self.isa()?;
        Ok(self
            .code_sections()
            .flat_map(|(address, code)| isa.address_loads(code, address, target))
            .collect())
    }

    /// Addresses of the direct calls of `target`.
    pub fn direct_calls_to(&self, target: u64) -> Result<Vec<u64>> {
        let isa = self.isa()?;
        Ok(self
            .code_sections()
            .flat_map(|(address, code)| isa.direct_calls(code, address, target))
            .collect())
    }

    /// Addresses of the direct jumps to `target` (tail calls).
    pub fn direct_jumps_to(&self, target: u64) -> Result<Vec<u64>> {
        let isa = self.isa()?;
        Ok(self
            .code_sections()
            .flat_map(|(address, code)| isa.direct_jumps(code, address, target))
            .collect())
    }

    /// True when a dynamic relocation puts `target` in memory (a function pointer in a table
    /// or a vtable: the function is then reached by indirect calls too).
    pub fn relocated_to(&self, target: u64) -> bool {
        let Ok(file) = ElfFile64::<object::Endianness>::parse(&self.data[..]) else {
            return false;
        };
        file.dynamic_relocations()
            .into_iter()
            .flatten()
            .any(|(_, r)| {
                r.addend() as u64 == target
                    && matches!(r.target(), object::RelocationTarget::Absolute)
            })
    }

    /// The direct calls of the function at `start` (`len` bytes) with their stores.
    pub fn call_sites(&self, start: u64, len: u64) -> Result<Vec<CallSite>> {
        let isa = self.isa()?;
        let Some(code) = self.code(start, len) else {
            bail!("function at {start:#x} is outside the file");
        };
        Ok(isa.call_sites(code, start))
    }

    /// The address of the function named `name` (mangled) in `.symtab`, when one is shipped.
    pub fn function_symbol(&self, name: &str) -> Option<u64> {
        let file = ElfFile64::<object::Endianness>::parse(&self.data[..]).ok()?;
        file.symbols()
            .find(|s| {
                s.kind() == SymbolKind::Text
                    && s.is_definition()
                    && s.name_bytes() == Ok(name.as_bytes())
            })
            .map(|s| s.address())
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
