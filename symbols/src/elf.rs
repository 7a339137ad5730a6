//! What the tracer needs to know about one ELF object on disk: exported functions and the file
//! offsets a uprobe attaches to, its dynamic dependencies and search paths, and its build-id.

use std::{collections::HashMap, fs, path::Path};

use anyhow::{Context, Result, bail};
use object::{
    Endian, Endianness, Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, SymbolKind,
    elf::{self, PT_LOAD},
    read::elf::{Dyn, ElfFile64, ProgramHeader, SectionHeader},
};

/// A function symbol defined in an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionSymbol {
    pub name: String,
    /// Virtual address as linked (before the load bias of a PIE or shared object).
    pub address: u64,
    pub size: u64,
    /// Offset in the file: what a uprobe on this object attaches to.
    pub file_offset: u64,
}

/// Which symbols [`ElfObject::open_lookup`] reads: the cost follows the question, not the
/// size of the file (a 400 MB library's 78 MB `.strtab` is never touched for 25 names).
pub struct Lookup<'a> {
    /// Exported names to look up in `.dynsym`, through its GNU hash table when it has one
    /// (a few cache lines per name instead of a pass over every symbol).
    pub names: &'a [&'a str],
    /// Further `.dynsym` names to keep (a pass over the table): e.g. a prefix family that
    /// only some libraries have. `None`: no pass.
    pub scan: Option<&'a dyn Fn(&str) -> bool>,
    /// Found names whose `NAME.cold` part (a local symbol, `.symtab` only) is wanted too;
    /// `.symtab` is read only when one of them is found.
    pub cold_of: &'a dyn Fn(&str) -> bool,
}

/// The parts of an ELF object the tracer uses to plan probes and find libraries.
#[derive(Clone, Debug, Default)]
pub struct ElfObject {
    /// Defined functions by name, from `.dynsym` and `.symtab` (dynamic wins on conflicts).
    pub functions: HashMap<String, FunctionSymbol>,
    /// Names of functions that other objects can call (from `.dynsym` only).
    pub exported: Vec<String>,
    pub needed: Vec<String>,
    pub soname: Option<String>,
    /// DT_RUNPATH entries, `$ORIGIN` not yet expanded.
    pub runpath: Vec<String>,
    /// DT_RPATH entries (only honoured by the loader when there is no RUNPATH).
    pub rpath: Vec<String>,
    pub build_id: Option<Vec<u8>>,
    /// The ELF interpreter (PT_INTERP), e.g. `/lib64/ld-linux-x86-64.so.2`.
    pub interpreter: Option<String>,
}

impl ElfObject {
    /// Parses the object at `path`. The file is mapped, not read: only the pages the parser
    /// touches (headers, symbol and string tables, the dynamic section) come in, so a
    /// multi-GB library costs its tables, not its size.
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_filtered(path, &|_| true)
    }

    /// As [`ElfObject::open`], keeping only the symbols whose names `keep` accepts (in
    /// `functions` and `exported`): a library exporting 100,000 functions costs a pass over
    /// its symbol tables, not 100,000 strings.
    pub fn open_filtered(path: &Path, keep: &dyn Fn(&str) -> bool) -> Result<Self> {
        let map =
            MappedFile::open(path).with_context(|| format!("cannot read {}", path.display()))?;
        Self::parse_filtered(map.bytes(), keep)
            .with_context(|| format!("cannot parse ELF file {}", path.display()))
    }

    /// As [`ElfObject::open_filtered`] for the symbols `lookup` asks for, without a pass over
    /// the symbol tables where the object allows it (see [`Lookup`]).
    pub fn open_lookup(path: &Path, lookup: &Lookup) -> Result<Self> {
        let map =
            MappedFile::open(path).with_context(|| format!("cannot read {}", path.display()))?;
        Self::parse_lookup(map.bytes(), lookup)
            .with_context(|| format!("cannot parse ELF file {}", path.display()))
    }

    /// As [`ElfObject::open_lookup`], on `file`, opened by the caller at `path`, whose
    /// length the caller read with `fstat` (and so knows which file it reads, whatever
    /// happens to the path meanwhile). A small file costs one `read`.
    pub fn read_lookup(file: &fs::File, path: &Path, len: u64, lookup: &Lookup) -> Result<Self> {
        let map = MappedFile::of_file(file, len)
            .with_context(|| format!("cannot read {}", path.display()))?;
        Self::parse_lookup(map.bytes(), lookup)
            .with_context(|| format!("cannot parse ELF file {}", path.display()))
    }

    /// As [`ElfObject::open_lookup`], on an in-memory image. Never panics on malformed input.
    pub fn parse_lookup(data: &[u8], lookup: &Lookup) -> Result<Self> {
        let file = parse_header(data)?;
        let endian = file.endian();
        let file_offset = file_offset_of(&file);
        let mut out = ElfObject::default();
        let dynsym = file.elf_dynamic_symbol_table();
        let sections = file.elf_section_table();
        // A table without bloom words is no table: object's lookup computes `count - 1` for
        // it, which panics in a debug build (a crafted or half-written library; seen in the
        // agent's soak test while a fixture was being rebuilt).
        let has_bloom_words = sections.iter().any(|s| {
            s.sh_type(endian) == elf::SHT_GNU_HASH
                && s.data(endian, data).is_ok_and(|d| {
                    d.get(8..12)
                        .is_some_and(|w| endian.read_u32_bytes(w.try_into().unwrap()) > 0)
                })
        });
        let hash = sections
            .gnu_hash(endian, data)
            .ok()
            .flatten()
            .filter(|(_, link)| has_bloom_words && *link == dynsym.section());
        match &hash {
            Some((table, _)) if !dynsym.is_empty() => {
                let versions = sections
                    .versions(endian, data)
                    .ok()
                    .flatten()
                    .unwrap_or_default();
                for name in lookup.names {
                    let bytes = name.as_bytes();
                    let Some((index, _)) =
                        table.find(endian, bytes, elf::gnu_hash(bytes), None, dynsym, &versions)
                    else {
                        continue;
                    };
                    if let Some(sym) = file.dynamic_symbol_table()
                        && let Ok(sym) = sym.symbol_by_index(index)
                    {
                        out.add(&sym, true, &|_| true, &file_offset);
                    }
                }
                if let Some(scan) = lookup.scan {
                    for sym in file.dynamic_symbols() {
                        out.add(&sym, true, scan, &file_offset);
                    }
                }
            }
            _ => {
                // No GNU hash table: one pass over `.dynsym`.
                let wanted =
                    |n: &str| lookup.names.contains(&n) || lookup.scan.is_some_and(|s| s(n));
                for sym in file.dynamic_symbols() {
                    out.add(&sym, true, &wanted, &file_offset);
                }
            }
        }
        let colds: Vec<String> = out
            .exported
            .iter()
            .filter(|n| (lookup.cold_of)(n))
            .map(|n| format!("{n}.cold"))
            .collect();
        if !colds.is_empty() {
            let wanted = |n: &str| colds.iter().any(|c| c == n);
            for sym in file.symbols() {
                out.add(&sym, false, &wanted, &file_offset);
            }
        }
        out.exported.sort();
        out.exported.dedup();
        out.read_dynamic(&file, data)?;
        Ok(out)
    }

    /// Records `sym` when it is a defined function whose name `keep` accepts. A dynamic
    /// symbol replaces a `.symtab` one of the same name.
    fn add<'data, 'file>(
        &mut self,
        sym: &impl ObjectSymbol<'data>,
        dynamic: bool,
        keep: &dyn Fn(&str) -> bool,
        file_offset: &dyn Fn(u64) -> Option<u64>,
    ) {
        if sym.kind() != SymbolKind::Text || sym.is_undefined() || sym.address() == 0 {
            return;
        }
        let Ok(name) = sym.name() else { return };
        if name.is_empty() || !keep(name) {
            return;
        }
        let Some(offset) = file_offset(sym.address()) else {
            return;
        };
        if dynamic && sym.is_global() {
            self.exported.push(name.to_string());
        }
        self.functions.insert(
            name.to_string(),
            FunctionSymbol {
                name: name.to_string(),
                address: sym.address(),
                size: sym.size(),
                file_offset: offset,
            },
        );
    }

    /// Parses an in-memory ELF image. Never panics on malformed input.
    pub fn parse(data: &[u8]) -> Result<Self> {
        Self::parse_filtered(data, &|_| true)
    }

    /// As [`ElfObject::parse`], keeping only the symbols whose names `keep` accepts.
    pub fn parse_filtered(data: &[u8], keep: &dyn Fn(&str) -> bool) -> Result<Self> {
        let file = parse_header(data)?;
        let file_offset = file_offset_of(&file);
        let mut out = ElfObject::default();
        for (symbols, dynamic) in [(file.symbols(), false), (file.dynamic_symbols(), true)] {
            for sym in symbols {
                out.add(&sym, dynamic, keep, &file_offset);
            }
        }
        out.exported.sort();
        out.exported.dedup();
        out.read_dynamic(&file, data)?;
        Ok(out)
    }

    /// DT_NEEDED, DT_SONAME, the search paths, the build-id and the interpreter.
    fn read_dynamic(&mut self, file: &ElfFile64<Endianness>, data: &[u8]) -> Result<()> {
        let endian = file.endian();
        let sections = file.elf_section_table();
        if let Some((entries, link)) = sections.dynamic(endian, data)? {
            let strings = sections.strings(endian, data, link)?;
            for d in entries {
                if !d.is_string(endian) {
                    continue;
                }
                let Ok(value) = d.string(endian, strings) else {
                    continue;
                };
                let value = String::from_utf8_lossy(value).into_owned();
                match d.tag32(endian) {
                    Some(elf::DT_NEEDED) => self.needed.push(value),
                    Some(elf::DT_SONAME) => self.soname = Some(value),
                    Some(elf::DT_RUNPATH) => self.runpath.extend(split_path_list(&value)),
                    Some(elf::DT_RPATH) => self.rpath.extend(split_path_list(&value)),
                    _ => {}
                }
            }
        }
        self.build_id = file.build_id().ok().flatten().map(<[u8]>::to_vec);
        if let Some(interp) = file.section_by_name(".interp")
            && let Ok(bytes) = interp.data()
        {
            let s = bytes.split(|b| *b == 0).next().unwrap_or_default();
            self.interpreter = Some(String::from_utf8_lossy(s).into_owned());
        }
        Ok(())
    }

    /// Looks up a defined function by name.
    pub fn function(&self, name: &str) -> Option<&FunctionSymbol> {
        self.functions.get(name)
    }

    /// True when other objects can bind to `name` in this object.
    pub fn exports(&self, name: &str) -> bool {
        self.exported
            .binary_search_by(|e| e.as_str().cmp(name))
            .is_ok()
    }
}

fn parse_header(data: &[u8]) -> Result<ElfFile64<'_, Endianness>> {
    if data.len() < 5 || &data[..4] != b"\x7fELF" {
        bail!("not an ELF file");
    }
    if data[4] != elf::ELFCLASS64 {
        bail!("only 64-bit ELF objects are supported");
    }
    Ok(ElfFile64::<Endianness>::parse(data)?)
}

/// Maps a linked virtual address to its file offset (through the PT_LOAD segments).
fn file_offset_of(file: &ElfFile64<Endianness>) -> impl Fn(u64) -> Option<u64> + use<> {
    let endian = file.endian();
    let loads: Vec<(u64, u64, u64)> = file
        .elf_program_headers()
        .iter()
        .filter(|ph| ph.p_type(endian) == PT_LOAD)
        .map(|ph| (ph.p_vaddr(endian), ph.p_filesz(endian), ph.p_offset(endian)))
        .collect();
    move |vaddr: u64| {
        loads
            .iter()
            .find(|(start, size, _)| vaddr >= *start && vaddr < start.saturating_add(*size))
            // Headers are input: an offset that overflows means no usable file offset.
            .and_then(|(start, _, off)| (vaddr - start).checked_add(*off))
    }
}

/// A file mapped read-only and private: reading it never changes it, and the pages it is
/// not asked for are never read from disk.
enum MappedFile {
    /// A small file, read instead.
    Read(Vec<u8>),
    Mapped {
        ptr: *mut libc::c_void,
        len: usize,
    },
}

/// Files up to this size are read rather than mapped: one `read` costs less than a mapping,
/// its page faults and the unmap (a directory of small plugins is read at a stop).
const READ_UP_TO: usize = 256 << 10;

impl MappedFile {
    fn open(path: &Path) -> std::io::Result<Self> {
        let file = fs::File::open(path)?;
        let len = file.metadata()?.len();
        Self::of_file(&file, len)
    }

    /// The first `len` bytes of `file` (its length when the caller read it): read with one
    /// `pread` when small, mapped otherwise.
    fn of_file(file: &fs::File, len: u64) -> std::io::Result<Self> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::FileExt;
        let len = usize::try_from(len).map_err(|_| std::io::ErrorKind::FileTooLarge)?;
        if len <= READ_UP_TO {
            // One read of the known length (`read_to_end` reads once more to see the end).
            let mut read = vec![0; len];
            let mut got = 0;
            while got < len {
                match file.read_at(&mut read[got..], got as u64) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            // A file that shrank meanwhile: what is there (the parse checks every bound).
            read.truncate(got);
            return Ok(MappedFile::Read(read));
        }
        // SAFETY: a fresh private read-only mapping of an open file; unmapped in Drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(MappedFile::Mapped { ptr, len })
    }

    fn bytes(&self) -> &[u8] {
        match self {
            MappedFile::Read(read) => read,
            // SAFETY: the mapping is `len` bytes long and lives as long as `self`. (A file
            // truncated under us would fault; libraries are replaced by rename, not rewritten.)
            MappedFile::Mapped { ptr, len } => unsafe {
                std::slice::from_raw_parts(*ptr as *const u8, *len)
            },
        }
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        if let MappedFile::Mapped { ptr, len } = *self {
            // SAFETY: unmapping our own mapping once.
            unsafe { libc::munmap(ptr, len) };
        }
    }
}

fn split_path_list(s: &str) -> impl Iterator<Item = String> + '_ {
    s.split(':').filter(|p| !p.is_empty()).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_non_elf_and_truncated_input() {
        assert!(ElfObject::parse(b"").is_err());
        assert!(ElfObject::parse(b"#!/bin/sh\n").is_err());
        let exe = fs::read("/proc/self/exe").unwrap();
        for cut in [5, 64, 200, exe.len() / 3] {
            // Must not panic; an error or a partial result are both fine.
            let _ = ElfObject::parse(&exe[..cut]);
        }
    }

    /// A `.gnu.hash` with no bloom words (crafted, or a library caught half-written) is
    /// read as no table: the lookup falls back to the pass over `.dynsym`, without a panic.
    #[test]
    fn a_gnu_hash_table_without_bloom_words_is_no_table() {
        let maps = fs::read_to_string("/proc/self/maps").unwrap();
        let libc = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.contains("/libc.so") || p.contains("/libc-"))
            .expect("libc mapped");
        let mut data = fs::read(libc).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let (at, _) = file
            .section_by_name(".gnu.hash")
            .and_then(|s| s.file_range())
            .expect("libc has .gnu.hash");
        drop(file);
        let bloom_size = at as usize + 8;
        data[bloom_size..bloom_size + 4].copy_from_slice(&0u32.to_ne_bytes());
        let lookup = Lookup {
            names: &["malloc"],
            scan: None,
            cold_of: &|_| false,
        };
        let obj = ElfObject::parse_lookup(&data, &lookup).unwrap();
        assert!(
            obj.functions.contains_key("malloc"),
            "found by the pass over .dynsym"
        );
    }

    #[test]
    fn inputs_the_fuzzer_crashed_on_parse_without_panicking() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz-regressions");
        let mut n = 0;
        for entry in fs::read_dir(&dir).unwrap() {
            let data = fs::read(entry.unwrap().path()).unwrap();
            let _ = ElfObject::parse(&data);
            n += 1;
        }
        assert!(n >= 1, "regression inputs in {}", dir.display());
    }

    #[test]
    fn reads_our_own_executable() {
        let obj = ElfObject::open(Path::new("/proc/self/exe")).unwrap();
        assert!(obj.build_id.is_some(), "rustc links a build-id by default");
        assert!(obj.needed.iter().any(|n| n.starts_with("libc.so")));
        assert!(
            obj.interpreter
                .as_deref()
                .unwrap_or("")
                .contains("ld-linux")
        );
        // A function of this very test binary is found with a file offset inside the file.
        let len = fs::metadata("/proc/self/exe").unwrap().len();
        let main = obj.function("main").expect("main symbol");
        assert!(main.file_offset > 0 && main.file_offset < len);
    }

    /// The x86-64 Debian libc the libc tests read; `None` (said loudly) where it is elsewhere.
    fn host_libc() -> Option<&'static str> {
        let found = [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
        ]
        .into_iter()
        .find(|p| Path::new(p).exists());
        if found.is_none() {
            eprintln!("SKIPPED: no x86-64 libc at the Debian paths");
        }
        found
    }

    /// The hash lookup finds what a pass over both tables finds, and nothing else.
    #[test]
    fn lookup_by_hash_agrees_with_a_full_pass() {
        let Some(libc) = host_libc() else { return };
        let data = fs::read(libc).unwrap();
        // Names with one version each (a pass keeps the last of several, dlsym the default).
        let names = ["malloc", "free", "exit", "calloc", "no_such_function_here"];
        let by_hash = ElfObject::parse_lookup(
            &data,
            &Lookup {
                names: &names,
                scan: Some(&|n: &str| n.starts_with("pthread_mutex_")),
                cold_of: &|_| false,
            },
        )
        .unwrap();
        let wanted = |n: &str| names.contains(&n) || n.starts_with("pthread_mutex_");
        let mut by_pass = ElfObject::parse_filtered(&data, &wanted).unwrap();
        // `.symtab` (absent from a stripped libc anyway) is not read without a `.cold` ask.
        by_pass
            .functions
            .retain(|n, _| by_pass.exported.contains(n));
        assert_eq!(by_hash.exported, by_pass.exported);
        assert_eq!(by_hash.functions, by_pass.functions);
        assert!(by_hash.exports("malloc") && by_hash.exports("pthread_mutex_lock"));
        assert!(!by_hash.exports("no_such_function_here"));
        assert_eq!(by_hash.needed, by_pass.needed);
        assert_eq!(by_hash.soname.as_deref(), Some("libc.so.6"));
        // Only the asked-for names.
        assert!(!by_hash.exports("printf"));
    }

    #[test]
    fn libc_exports_malloc_at_a_text_offset() {
        let Some(libc) = host_libc() else { return };
        let obj = ElfObject::open(Path::new(libc)).unwrap();
        assert!(obj.exports("malloc") && obj.exports("free"));
        assert!(!obj.exports("definitely_not_a_libc_symbol"));
        let data = fs::read(libc).unwrap();
        let off = obj.function("malloc").unwrap().file_offset as usize;
        assert!(off < data.len());
        assert_eq!(obj.soname.as_deref(), Some("libc.so.6"));
    }
}
