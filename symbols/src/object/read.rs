//! Reading an object's bytes (an open file read with `pread`, or memory) and copying out
//! the parts an [`ObjectInfo`](super::ObjectInfo) keeps: segments, function symbols, CFI
//! sections, build-id and debuglink.

use std::{
    borrow::Cow,
    fs::File,
    io::{self, Read, Seek, SeekFrom},
    os::unix::fs::FileExt,
    sync::Arc,
};

use anyhow::{Context as _, Result, bail};
use gimli::RunTimeEndian;
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, ReadCache, ReadRef, SymbolKind};

use super::{Segment, cfi::CfiSections, symtab::Sym};

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
pub(crate) struct PreadFile {
    pub(crate) file: Arc<File>,
    pub(crate) pos: u64,
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

/// The parts of one ELF file we keep, copied out of the parser.
#[derive(Default)]
pub(crate) struct Parts {
    pub(crate) build_id: Option<Vec<u8>>,
    pub(crate) debuglink: Option<(String, u32)>,
    pub(crate) segments: Vec<Segment>,
    pub(crate) symbols: Vec<(Sym, bool)>,
    pub(crate) cfi: CfiSections,
    pub(crate) has_dwarf: bool,
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
    p.cfi.aarch64 = file.architecture() == object::Architecture::Aarch64;
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
        && let Some(d) = section_bytes(&s)
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

/// Deflate expands 1 byte to at most ~1032; a compressed section that claims more is corrupt
/// (the fuzzer's claimed terabytes, whose allocation aborted the process).
const MAX_INFLATION: u64 = 1032;

/// A section's bytes, decompressed when the file compresses it; None for a compressed section
/// whose stated size is more than its data could hold.
pub(crate) fn section_bytes<'d, S: ObjectSection<'d>>(section: &S) -> Option<Cow<'d, [u8]>> {
    let compressed = section.compressed_data().ok()?;
    if compressed.format != object::CompressionFormat::None
        && compressed.uncompressed_size
            > (compressed.data.len() as u64).saturating_mul(MAX_INFLATION)
    {
        return None;
    }
    compressed.decompress().ok()
}

pub(crate) fn parts(source: &Source) -> Result<Parts> {
    match source {
        Source::Bytes(b) => parts_of(&b[..]),
        Source::File(f) => parts_of(&ReadCache::new(PreadFile {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The fuzzer's input whose compressed DWARF section claims ~terabytes: refused before any
    /// allocation (the allocation aborted the fuzzer), while the file's other sections read.
    #[test]
    fn a_compressed_section_claiming_more_than_it_can_hold_is_refused() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/fuzz-regressions/dwarf-section-claims-terabytes.bin"
        );
        let data = std::fs::read(path).unwrap();
        let file = object::File::parse(&data[..]).unwrap();
        let mut refused = 0;
        let mut read = 0;
        for s in file.sections() {
            let c = s.compressed_data().unwrap();
            let claims_too_much = c.format != object::CompressionFormat::None
                && c.uncompressed_size > c.data.len() as u64 * MAX_INFLATION;
            match section_bytes(&s) {
                None if claims_too_much => refused += 1,
                Some(_) if !claims_too_much => read += 1,
                other => panic!("{:?}: {:?}", s.name(), other.map(|d| d.len())),
            }
        }
        assert!(refused >= 1 && read >= 1, "refused {refused}, read {read}");
    }
}
