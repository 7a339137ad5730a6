//! DWARF line tables and inline frames, loaded on first use: source frames for an address,
//! innermost inlined frame first, with the ELF symbol as the fallback.

use std::{
    borrow::Cow,
    sync::{Arc, Mutex},
};

use anyhow::{Context as _, Result};
use gimli::RunTimeEndian;
use object::{Object, ObjectSection, ReadCache, ReadRef};

use super::{
    ObjectInfo, SourceFrame,
    read::{DwarfReader, PreadFile, Source, section_bytes},
};
use crate::demangle::demangle;

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
            .and_then(|s| section_bytes(&s))
            .unwrap_or(Cow::Borrowed(&[]));
        Ok(gimli::EndianArcSlice::new(Arc::from(&*data), endian))
    };
    Ok(gimli::Dwarf::load(load)?)
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

impl ObjectInfo {
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
}
