//! One ELF object parsed for symbolization and unwinding: its load segments, a sorted function
//! table (`.symtab` + `.dynsym`, also from a separate debug file), its call frame information
//! (`.eh_frame`, `.debug_frame`) and, lazily, its DWARF line tables and inline frames.
//!
//! Everything here is parsed once; lookups are binary searches over sorted tables. Malformed
//! input gives errors or empty answers, never a panic.
//!
//! This file holds [`ObjectInfo`] and its loading; the parts live beside it: `read` (the
//! object's bytes and what is copied out of them), `symtab` (function symbols), `cfi` (FDE
//! index and unwind rows), `lines` (DWARF line tables and inline frames) and `debug_file`
//! (finding a separate debug file).

mod cfi;
mod debug_file;
mod lines;
mod read;
mod symtab;

use std::{
    fs::File,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, OnceLock},
};

use anyhow::{Context as _, Result};

pub(crate) use cfi::{CfaRule, Rule, UnwindRow};
use cfi::{CfiSections, FdeRange};
pub(crate) use debug_file::DebugSearch;
use debug_file::{find_debug_file, hex};
use read::{DwarfReader, parts};
pub(crate) use read::{Source, build_id_of};
use symtab::SymbolTable;

use crate::demangle::demangle;

/// A PT_LOAD segment: file bytes `[offset, offset+filesz)` are mapped at `[vaddr, vaddr+memsz)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub vaddr: u64,
    pub memsz: u64,
    pub offset: u64,
    pub filesz: u64,
}

/// One frame of source information for a virtual address in an object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceFrame {
    /// Demangled function name.
    pub function: Option<String>,
    /// Offset of the address from the start of the ELF symbol (outermost frame only).
    pub symbol_offset: Option<u64>,
    /// Source file, as recorded in DWARF (usually absolute).
    pub file: Option<String>,
    pub line: Option<u32>,
    /// This frame was inlined into the next one.
    pub inlined: bool,
}

/// An ELF object parsed for symbolization and unwinding.
pub struct ObjectInfo {
    build_id: Option<Vec<u8>>,
    segments: Vec<Segment>,
    symbols: SymbolTable,
    cfi: CfiSections,
    cfi_index: OnceLock<Vec<FdeRange>>,
    /// Where the DWARF lives: the object itself or a separate debug file.
    dwarf_source: Option<Source>,
    debug_file: Option<PathBuf>,
    dwarf: OnceLock<Option<Mutex<addr2line::Context<DwarfReader>>>>,
}

impl std::fmt::Debug for ObjectInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectInfo")
            .field("build_id", &self.build_id.as_ref().map(|b| hex(b)))
            .field("segments", &self.segments)
            .field("symbols", &self.symbols.len())
            .field("debug_file", &self.debug_file)
            .finish_non_exhaustive()
    }
}

impl ObjectInfo {
    /// Parses an in-memory ELF image (no separate debug file is searched).
    pub fn from_bytes(data: impl Into<Arc<[u8]>>) -> Result<Self> {
        Self::load(Source::Bytes(data.into()), &DebugSearch::default())
    }

    /// Parses the ELF file at `path`, looking for a separate debug file in `debug_dirs`.
    pub fn open(path: &Path, debug_dirs: &[PathBuf]) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        Self::load(
            Source::File(Arc::new(file)),
            &DebugSearch {
                object_path: Some(path.to_path_buf()),
                root: None,
                debug_dirs: debug_dirs.to_vec(),
            },
        )
    }

    pub(crate) fn load(source: Source, search: &DebugSearch) -> Result<Self> {
        let mut p = parts(&source)?;
        let mut debug_file = None;
        let mut dwarf_source = p.has_dwarf.then(|| source.clone());
        if !p.has_dwarf
            && let Some((path, src, dp)) = find_debug_file(&p, search)
        {
            // The debug file has the full .symtab a stripped object lacks, and maybe
            // .debug_frame; its addresses are the object's.
            p.symbols.extend(dp.symbols);
            if p.cfi.debug_frame.is_none() && dp.cfi.debug_frame.is_some() {
                p.cfi.debug_frame = dp.cfi.debug_frame;
            }
            if dp.has_dwarf {
                dwarf_source = Some(src);
            }
            debug_file = Some(path);
        }
        Ok(ObjectInfo {
            build_id: p.build_id,
            segments: p.segments,
            symbols: SymbolTable::build(p.symbols),
            cfi: p.cfi,
            cfi_index: OnceLock::new(),
            dwarf_source,
            debug_file,
            dwarf: OnceLock::new(),
        })
    }

    pub fn build_id(&self) -> Option<&[u8]> {
        self.build_id.as_deref()
    }

    /// The separate debug file used, if any.
    pub fn debug_file(&self) -> Option<&Path> {
        self.debug_file.as_deref()
    }

    /// True when DWARF debug info (in the object or a debug file) is available.
    pub fn has_dwarf(&self) -> bool {
        self.dwarf_source.is_some()
    }

    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Number of distinct function symbols.
    pub fn symbol_count(&self) -> usize {
        self.symbols.len()
    }

    /// The ELF virtual address that file offset `offset` is loaded at.
    pub fn file_offset_to_vaddr(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|s| offset >= s.offset && offset - s.offset < s.filesz.max(1))
            .and_then(|s| (offset - s.offset).checked_add(s.vaddr))
    }

    /// The ELF function symbol containing `vaddr`, demangled, and the offset into it.
    pub fn symbol(&self, vaddr: u64) -> Option<(String, u64)> {
        self.symbols
            .lookup(vaddr)
            .map(|(name, off)| (demangle(name), off))
    }
}
#[cfg(test)]
mod tests {
    use gimli::UnwindContext;

    use super::*;

    #[test]
    fn own_executable_has_symbols_cfi_and_dwarf() {
        let obj = ObjectInfo::open(Path::new("/proc/self/exe"), &[]).unwrap();
        assert!(obj.symbol_count() > 100);
        assert!(obj.has_cfi() && obj.fde_count() > 100);
        let f = own_executable_has_symbols_cfi_and_dwarf as *const () as usize as u64;
        // Translate our own runtime address into an ELF address through our maps.
        let maps = crate::read_maps(std::process::id()).unwrap();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let m = maps
            .iter()
            .find(|m| m.path.as_deref() == Some(&exe) && m.start <= f && f < m.end)
            .unwrap();
        let vaddr = obj.file_offset_to_vaddr(f - m.start + m.offset).unwrap();
        let (name, off) = obj.symbol(vaddr).unwrap();
        assert!(
            name.contains("own_executable_has_symbols_cfi_and_dwarf"),
            "{name}"
        );
        assert_eq!(off, 0);
        let mut ctx = UnwindContext::new();
        assert!(obj.unwind_row(vaddr, &mut ctx).is_some());
        let frames = obj.symbolize(vaddr + 4);
        let outer = frames.last().unwrap();
        assert!(
            outer
                .function
                .as_deref()
                .unwrap_or("")
                .contains("own_executable")
        );
        if obj.has_dwarf() {
            assert!(outer.file.as_deref().unwrap_or("").ends_with("object.rs"));
        }
    }

    #[test]
    fn garbage_and_truncations_never_panic() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        for cut in [0, 4, 16, 64, 200, 4096, exe.len() / 7, exe.len() / 2] {
            if let Ok(obj) = ObjectInfo::from_bytes(&exe[..cut.min(exe.len())]) {
                let _ = obj.fde_count();
                for a in [0u64, 0x1000, 0x10_0000, u64::MAX] {
                    let _ = obj.symbolize(a);
                    let _ = obj.unwind_row(a, &mut UnwindContext::new());
                }
            }
        }
        assert!(ObjectInfo::from_bytes(&b"\x7fELF garbage"[..]).is_err());
    }
}
