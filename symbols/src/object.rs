//! One ELF object parsed for symbolization and unwinding: its load segments, a sorted function
//! table (`.symtab` + `.dynsym`, also from a separate debug file), its call frame information
//! (`.eh_frame`, `.debug_frame`) and, lazily, its DWARF line tables and inline frames.
//!
//! Everything here is parsed once; lookups are binary searches over sorted tables. Malformed
//! input gives errors or empty answers, never a panic.

use std::{
    borrow::Cow,
    collections::HashMap,
    fs::File,
    io::{self, Read, Seek, SeekFrom},
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, OnceLock},
};

use anyhow::{Context as _, Result, bail};
use gimli::{
    BaseAddresses, CieOrFde, DebugFrame, EhFrame, EndianSlice, RunTimeEndian, UnwindContext,
    UnwindSection,
};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, ReadCache, ReadRef, SymbolKind};

use crate::demangle::demangle;

pub(crate) type DwarfReader = gimli::EndianArcSlice<RunTimeEndian>;

/// Where the bytes of an object come from.
#[derive(Clone, Debug)]
pub(crate) enum Source {
    /// An open file, read with `pread` on demand (never mapped: a file truncated under us
    /// must give read errors, not SIGBUS).
    File(Arc<File>),
    Bytes(Arc<[u8]>),
}

/// `Read + Seek` over a shared file with positioned reads, so several parsers can share it.
struct PreadFile {
    file: Arc<File>,
    pos: u64,
}

impl Read for PreadFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for PreadFile {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        let len = self.file.metadata()?.len();
        let new = match pos {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = new.ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        Ok(self.pos)
    }
}

/// A PT_LOAD segment: file bytes `[offset, offset+filesz)` are mapped at `[vaddr, vaddr+memsz)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub vaddr: u64,
    pub memsz: u64,
    pub offset: u64,
    pub filesz: u64,
}

#[derive(Clone, Debug)]
struct Sym {
    addr: u64,
    size: u64,
    name: Box<str>,
}

/// Function symbols sorted by address.
#[derive(Clone, Debug, Default)]
struct SymbolTable {
    syms: Vec<Sym>,
}

impl SymbolTable {
    fn build(mut raw: Vec<(Sym, bool)>) -> Self {
        // At one address prefer a sized, global, then shorter-named symbol.
        raw.sort_by(|(a, ag), (b, bg)| {
            a.addr
                .cmp(&b.addr)
                .then((a.size == 0).cmp(&(b.size == 0)))
                .then(bg.cmp(ag))
                .then(a.name.len().cmp(&b.name.len()))
        });
        raw.dedup_by(|(a, _), (b, _)| a.addr == b.addr);
        SymbolTable {
            syms: raw.into_iter().map(|(s, _)| s).collect(),
        }
    }

    /// The function containing `vaddr` and the offset into it.
    fn lookup(&self, vaddr: u64) -> Option<(&str, u64)> {
        let idx = self.syms.partition_point(|s| s.addr <= vaddr);
        let mut i = idx;
        // A few symbols back, in case of nested or aliased ranges.
        while i > 0 && idx - i < 8 {
            i -= 1;
            let s = &self.syms[i];
            let off = vaddr - s.addr;
            if (s.size > 0 && off < s.size) || (s.size == 0 && i + 1 == idx) {
                return Some((&s.name, off));
            }
        }
        None
    }

    fn len(&self) -> usize {
        self.syms.len()
    }
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

#[derive(Clone, Copy, Debug)]
struct FdeRange {
    start: u64,
    end: u64,
    offset: usize,
    debug_frame: bool,
}

/// Raw CFI sections and the addresses gimli needs for pointer encodings.
#[derive(Clone, Debug, Default)]
struct CfiSections {
    endian: Option<RunTimeEndian>,
    eh_frame: Option<(u64, Arc<[u8]>)>,
    debug_frame: Option<Arc<[u8]>>,
    eh_frame_hdr: Option<u64>,
    text: Option<u64>,
    got: Option<u64>,
    address_size: u8,
}

impl CfiSections {
    fn bases(&self) -> BaseAddresses {
        let mut b = BaseAddresses::default();
        if let Some((addr, _)) = &self.eh_frame {
            b = b.set_eh_frame(*addr);
        }
        if let Some(a) = self.eh_frame_hdr {
            b = b.set_eh_frame_hdr(a);
        }
        if let Some(a) = self.text {
            b = b.set_text(a);
        }
        if let Some(a) = self.got {
            b = b.set_got(a);
        }
        b
    }

    fn eh(&self) -> Option<EhFrame<EndianSlice<'_, RunTimeEndian>>> {
        let (_, data) = self.eh_frame.as_ref()?;
        let mut s = EhFrame::new(data, self.endian?);
        s.set_address_size(self.address_size);
        Some(s)
    }

    fn debug(&self) -> Option<DebugFrame<EndianSlice<'_, RunTimeEndian>>> {
        let data = self.debug_frame.as_ref()?;
        let mut s = DebugFrame::new(data, self.endian?);
        s.set_address_size(self.address_size);
        Some(s)
    }

    /// Every FDE's address range, sorted; CIEs parsed once each.
    fn index(&self) -> Vec<FdeRange> {
        let bases = self.bases();
        let mut out = Vec::new();
        if let Some(eh) = self.eh() {
            index_section(&eh, &bases, false, &mut out);
        }
        if let Some(df) = self.debug() {
            index_section(&df, &bases, true, &mut out);
        }
        out.sort_by_key(|f| (f.start, f.debug_frame));
        out
    }
}

fn index_section<'a, S>(
    section: &S,
    bases: &BaseAddresses,
    debug_frame: bool,
    out: &mut Vec<FdeRange>,
) where
    S: UnwindSection<EndianSlice<'a, RunTimeEndian>>,
    S::Offset: gimli::UnwindOffset<usize> + std::hash::Hash + Eq + Copy,
{
    let mut cies = HashMap::new();
    let mut entries = section.entries(bases);
    // A bound on entries keeps a hostile section from looping for long.
    for _ in 0..10_000_000 {
        let Ok(Some(entry)) = entries.next() else {
            break;
        };
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = partial.parse(|sec, b, off| {
            if let Some(c) = cies.get(&off) {
                return Ok(Clone::clone(c));
            }
            let c = sec.cie_from_offset(b, off)?;
            cies.insert(off, c.clone());
            Ok(c)
        });
        let Ok(fde) = fde else { continue };
        let start = fde.initial_address();
        let Some(end) = start.checked_add(fde.len()) else {
            continue;
        };
        if fde.len() == 0 {
            continue;
        }
        out.push(FdeRange {
            start,
            end,
            offset: fde.offset(),
            debug_frame,
        });
    }
}

/// How to recover a register in the caller, owned so the unwinder borrows nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Rule {
    Undefined,
    SameValue,
    Offset(i64),
    ValOffset(i64),
    Register(u16),
    Expression(Vec<u8>),
    ValExpression(Vec<u8>),
    Constant(u64),
    Unsupported,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CfaRule {
    RegisterOffset(u16, i64),
    Expression(Vec<u8>),
}

/// The unwind rules that hold at one address.
#[derive(Clone, Debug)]
pub(crate) struct UnwindRow {
    pub cfa: CfaRule,
    pub return_address_register: u16,
    pub rules: Vec<(u16, Rule)>,
    pub encoding: gimli::Encoding,
    pub endian: RunTimeEndian,
}

fn row_from<'a, S>(
    section: &S,
    bases: &BaseAddresses,
    offset: usize,
    vaddr: u64,
    ctx: &mut UnwindContext<usize>,
    endian: RunTimeEndian,
) -> Option<UnwindRow>
where
    S: UnwindSection<EndianSlice<'a, RunTimeEndian>>,
    S::Offset: gimli::UnwindOffset<usize>,
{
    let fde = section
        .fde_from_offset(bases, S::Offset::from(offset), S::cie_from_offset)
        .ok()?;
    let encoding = fde.cie().encoding();
    let ra = fde.cie().return_address_register().0;
    let row = fde
        .unwind_info_for_address(section, bases, ctx, vaddr)
        .ok()?;
    let expr_bytes = |e: &gimli::UnwindExpression<usize>| -> Option<Vec<u8>> {
        let expr: gimli::Expression<EndianSlice<'a, RunTimeEndian>> = e.get(section).ok()?;
        Some(expr.0.slice().to_vec())
    };
    let cfa = match row.cfa() {
        gimli::CfaRule::RegisterAndOffset { register, offset } => {
            CfaRule::RegisterOffset(register.0, *offset)
        }
        gimli::CfaRule::Expression(e) => CfaRule::Expression(expr_bytes(e)?),
    };
    let rules = row
        .registers()
        .map(|(reg, rule)| {
            let r = match rule {
                gimli::RegisterRule::Undefined => Rule::Undefined,
                gimli::RegisterRule::SameValue => Rule::SameValue,
                gimli::RegisterRule::Offset(o) => Rule::Offset(*o),
                gimli::RegisterRule::ValOffset(o) => Rule::ValOffset(*o),
                gimli::RegisterRule::Register(r) => Rule::Register(r.0),
                gimli::RegisterRule::Expression(e) => {
                    expr_bytes(e).map_or(Rule::Unsupported, Rule::Expression)
                }
                gimli::RegisterRule::ValExpression(e) => {
                    expr_bytes(e).map_or(Rule::Unsupported, Rule::ValExpression)
                }
                gimli::RegisterRule::Constant(c) => Rule::Constant(*c),
                _ => Rule::Unsupported,
            };
            (reg.0, r)
        })
        .collect();
    Some(UnwindRow {
        cfa,
        return_address_register: ra,
        rules,
        encoding,
        endian,
    })
}

/// Debug-file search settings, captured when the object is parsed.
#[derive(Clone, Debug, Default)]
pub(crate) struct DebugSearch {
    /// The object's path as the process sees it (for `.gnu_debuglink` next to it).
    pub object_path: Option<PathBuf>,
    /// A prefix for paths in the process's mount namespace, e.g. `/proc/PID/root`.
    pub root: Option<PathBuf>,
    /// Global debug roots, e.g. `/usr/lib/debug`.
    pub debug_dirs: Vec<PathBuf>,
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

/// The parts of one ELF file we keep, copied out of the parser.
#[derive(Default)]
struct Parts {
    build_id: Option<Vec<u8>>,
    debuglink: Option<(String, u32)>,
    segments: Vec<Segment>,
    symbols: Vec<(Sym, bool)>,
    cfi: CfiSections,
    has_dwarf: bool,
}

fn parts_of<'d, R: ReadRef<'d>>(data: R) -> Result<Parts> {
    let file = object::File::parse(data).context("not a valid object file")?;
    if file.format() != object::BinaryFormat::Elf {
        bail!("not an ELF file");
    }
    let mut p = Parts {
        build_id: file.build_id().ok().flatten().map(<[u8]>::to_vec),
        debuglink: file
            .gnu_debuglink()
            .ok()
            .flatten()
            .map(|(n, crc)| (String::from_utf8_lossy(n).into_owned(), crc)),
        ..Parts::default()
    };
    for seg in file.segments() {
        let (offset, filesz) = seg.file_range();
        p.segments.push(Segment {
            vaddr: seg.address(),
            memsz: seg.size(),
            offset,
            filesz,
        });
    }
    for sym in file.symbols().chain(file.dynamic_symbols()) {
        if sym.kind() != SymbolKind::Text || !sym.is_definition() || sym.address() == 0 {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        if name.is_empty() {
            continue;
        }
        p.symbols.push((
            Sym {
                addr: sym.address(),
                size: sym.size(),
                name: name.into(),
            },
            sym.is_global(),
        ));
    }
    let endian = if file.is_little_endian() {
        RunTimeEndian::Little
    } else {
        RunTimeEndian::Big
    };
    p.cfi.endian = Some(endian);
    p.cfi.address_size = if file.is_64() { 8 } else { 4 };
    let loaded = |name: &str| {
        file.section_by_name(name)
            .filter(|s| s.kind() != object::SectionKind::UninitializedData)
    };
    if let Some(s) = loaded(".eh_frame")
        && let Ok(d) = s.data()
        && !d.is_empty()
    {
        p.cfi.eh_frame = Some((s.address(), Arc::from(d)));
    }
    if let Some(s) = loaded(".debug_frame")
        && let Ok(d) = s.uncompressed_data()
        && !d.is_empty()
    {
        p.cfi.debug_frame = Some(Arc::from(&*d));
    }
    p.cfi.eh_frame_hdr = loaded(".eh_frame_hdr").map(|s| s.address());
    p.cfi.text = loaded(".text").map(|s| s.address());
    p.cfi.got = loaded(".got").map(|s| s.address());
    p.has_dwarf = loaded(".debug_info").is_some_and(|s| s.size() > 0)
        && file
            .section_by_name(".debug_info")
            .is_some_and(|s| s.file_range().is_some_and(|(_, size)| size > 0));
    Ok(p)
}

fn dwarf_of<'d, R: ReadRef<'d>>(data: R) -> Result<gimli::Dwarf<DwarfReader>> {
    let file = object::File::parse(data).context("not a valid object file")?;
    let endian = if file.is_little_endian() {
        RunTimeEndian::Little
    } else {
        RunTimeEndian::Big
    };
    let load = |id: gimli::SectionId| -> Result<DwarfReader, gimli::Error> {
        let data: Cow<'_, [u8]> = file
            .section_by_name(id.name())
            .filter(|s| s.kind() != object::SectionKind::UninitializedData)
            .and_then(|s| s.uncompressed_data().ok())
            .unwrap_or(Cow::Borrowed(&[]));
        Ok(gimli::EndianArcSlice::new(Arc::from(&*data), endian))
    };
    Ok(gimli::Dwarf::load(load)?)
}

fn parts(source: &Source) -> Result<Parts> {
    match source {
        Source::Bytes(b) => parts_of(&b[..]),
        Source::File(f) => parts_of(&ReadCache::new(PreadFile {
            file: f.clone(),
            pos: 0,
        })),
    }
}

fn dwarf(source: &Source) -> Result<gimli::Dwarf<DwarfReader>> {
    match source {
        Source::Bytes(b) => dwarf_of(&b[..]),
        Source::File(f) => dwarf_of(&ReadCache::new(PreadFile {
            file: f.clone(),
            pos: 0,
        })),
    }
}

/// Reads just the build-id of an object (cheap: headers and one note).
pub(crate) fn build_id_of(source: &Source) -> Option<Vec<u8>> {
    fn inner<'d, R: ReadRef<'d>>(data: R) -> Option<Vec<u8>> {
        let file = object::File::parse(data).ok()?;
        file.build_id().ok().flatten().map(<[u8]>::to_vec)
    }
    match source {
        Source::Bytes(b) => inner(&b[..]),
        Source::File(f) => inner(&ReadCache::new(PreadFile {
            file: f.clone(),
            pos: 0,
        })),
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

    fn context(&self) -> Option<&Mutex<addr2line::Context<DwarfReader>>> {
        self.dwarf
            .get_or_init(|| {
                let src = self.dwarf_source.as_ref()?;
                let dwarf = dwarf(src).ok()?;
                addr2line::Context::from_dwarf(dwarf).ok().map(Mutex::new)
            })
            .as_ref()
    }

    /// Source frames for `vaddr`, innermost inlined frame first, the outermost (real)
    /// function last. Never empty: without any information one frame with no fields is
    /// returned.
    pub fn symbolize(&self, vaddr: u64) -> Vec<SourceFrame> {
        let mut frames = Vec::new();
        // addr2line probes `[vaddr, vaddr + 1)`.
        if vaddr < u64::MAX
            && let Some(ctx) = self.context()
        {
            let ctx = ctx.lock().unwrap_or_else(|e| e.into_inner());
            if let Ok(mut iter) = ctx.find_frames(vaddr).skip_all_loads() {
                // Bound the inline depth against corrupt DWARF.
                for _ in 0..256 {
                    let Ok(Some(f)) = iter.next() else { break };
                    let function = f.function.as_ref().and_then(|n| {
                        let raw = n.raw_name().ok()?;
                        Some(demangle(&raw))
                    });
                    let (file, line) = match &f.location {
                        Some(l) => (l.file.map(str::to_string), l.line),
                        None => (None, None),
                    };
                    frames.push(SourceFrame {
                        function,
                        symbol_offset: None,
                        file,
                        line,
                        inlined: true,
                    });
                }
            }
        }
        let symbol = self.symbols.lookup(vaddr);
        match frames.last_mut() {
            Some(outer) => {
                outer.inlined = false;
                if let Some((name, off)) = symbol {
                    if outer.function.is_none() {
                        outer.function = Some(demangle(name));
                    }
                    outer.symbol_offset = Some(off);
                }
            }
            None => frames.push(SourceFrame {
                function: symbol.map(|(n, _)| demangle(n)),
                symbol_offset: symbol.map(|(_, o)| o),
                ..SourceFrame::default()
            }),
        }
        frames
    }

    /// True when the object has CFI (`.eh_frame` or `.debug_frame`).
    pub fn has_cfi(&self) -> bool {
        self.cfi.eh_frame.is_some() || self.cfi.debug_frame.is_some()
    }

    /// Number of FDEs (building the index on first use).
    pub fn fde_count(&self) -> usize {
        self.cfi_index.get_or_init(|| self.cfi.index()).len()
    }

    /// The CFI row that holds at `vaddr`, if an FDE covers it.
    pub(crate) fn unwind_row(
        &self,
        vaddr: u64,
        ctx: &mut UnwindContext<usize>,
    ) -> Option<UnwindRow> {
        let index = self.cfi_index.get_or_init(|| self.cfi.index());
        let idx = index.partition_point(|f| f.start <= vaddr);
        let fde = index[..idx]
            .iter()
            .rev()
            .take(4)
            .find(|f| vaddr < f.end)
            .copied()?;
        let bases = self.cfi.bases();
        let endian = self.cfi.endian?;
        if fde.debug_frame {
            row_from(&self.cfi.debug()?, &bases, fde.offset, vaddr, ctx, endian)
        } else {
            row_from(&self.cfi.eh()?, &bases, fde.offset, vaddr, ctx, endian)
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Standard CRC-32 (as used by `.gnu_debuglink`).
pub(crate) fn crc32(mut crc: u32, data: &[u8]) -> u32 {
    static TABLE: OnceLock<[u32; 256]> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            *e = c;
        }
        t
    });
    crc = !crc;
    for b in data {
        crc = table[((crc ^ u32::from(*b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

fn file_crc(file: &File) -> Option<u32> {
    let mut crc = 0;
    let mut buf = vec![0u8; 1 << 16];
    let mut pos = 0u64;
    loop {
        let n = file.read_at(&mut buf, pos).ok()?;
        if n == 0 {
            return Some(crc);
        }
        crc = crc32(crc, &buf[..n]);
        pos += n as u64;
    }
}

/// Candidate debug files in the documented order: `.gnu_debuglink` next to the object, in
/// `.debug/` beside it, under each debug root + the object's directory; then
/// `<debug root>/.build-id/xx/rest.debug`.
fn debug_candidates(p: &Parts, search: &DebugSearch) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let rooted = |path: &Path| -> Vec<PathBuf> {
        let mut v = Vec::new();
        if let Some(root) = &search.root {
            v.push(root.join(path.strip_prefix("/").unwrap_or(path)));
        }
        v.push(path.to_path_buf());
        v
    };
    if let (Some((name, _)), Some(obj)) = (&p.debuglink, &search.object_path)
        && !name.is_empty()
        && !name.contains('/')
        && let Some(dir) = obj.parent()
    {
        out.extend(rooted(&dir.join(name)));
        out.extend(rooted(&dir.join(".debug").join(name)));
        for d in &search.debug_dirs {
            let rel = dir.strip_prefix("/").unwrap_or(dir);
            out.push(d.join(rel).join(name));
        }
    }
    if let Some(id) = &p.build_id
        && id.len() >= 2
    {
        let h = hex(id);
        for d in &search.debug_dirs {
            out.push(
                d.join(".build-id")
                    .join(&h[..2])
                    .join(format!("{}.debug", &h[2..])),
            );
        }
    }
    out
}

fn find_debug_file(p: &Parts, search: &DebugSearch) -> Option<(PathBuf, Source, Parts)> {
    for cand in debug_candidates(p, search) {
        let Ok(file) = File::open(&cand) else {
            continue;
        };
        if !file.metadata().is_ok_and(|m| m.is_file()) {
            continue;
        }
        let file = Arc::new(file);
        let src = Source::File(file.clone());
        let Ok(dp) = parts(&src) else { continue };
        // A debug file must belong to this object: same build-id, or the debuglink CRC
        // when there is no build-id to compare.
        let matches = match (&p.build_id, &dp.build_id) {
            (Some(a), Some(b)) => a == b,
            _ => match &p.debuglink {
                Some((_, crc)) => file_crc(&file) == Some(*crc),
                None => false,
            },
        };
        if matches {
            return Some((cand, src, dp));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_matches_known_vector() {
        assert_eq!(crc32(0, b"123456789"), 0xcbf4_3926);
        let a = crc32(0, b"1234");
        assert_eq!(crc32(a, b"56789"), 0xcbf4_3926);
    }

    #[test]
    fn symbol_table_prefers_sized_global_and_falls_back_to_nearest() {
        let s = |addr, size, name: &str| Sym {
            addr,
            size,
            name: name.into(),
        };
        let t = SymbolTable::build(vec![
            (s(0x100, 0x10, "local_alias"), false),
            (s(0x100, 0x10, "f"), true),
            (s(0x200, 0, "no_size"), true),
            (s(0x300, 0x8, "g"), true),
        ]);
        assert_eq!(t.len(), 3);
        assert_eq!(t.lookup(0x105), Some(("f", 5)));
        assert_eq!(t.lookup(0x110), None);
        assert_eq!(t.lookup(0x250), Some(("no_size", 0x50)));
        assert_eq!(t.lookup(0x307), Some(("g", 7)));
        assert_eq!(t.lookup(0x308), None);
        assert_eq!(t.lookup(0x50), None);
    }

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
