//! A snapshot of a process's memory map: which module (file) an absolute address falls in, and
//! at which file offset. The view is immutable and cheap to keep, so the tracer can take one
//! when the maps change and symbolize events later.

use std::{
    collections::HashMap,
    fs::File,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, OnceLock},
};

use anyhow::Result;

use crate::{
    maps::{MapEntry, parse_maps, read_maps},
    object::{ObjectInfo, UnwindRow},
    symbolize::Frame,
};

/// A file mapped into the process, shared by all its mappings.
#[derive(Debug)]
pub struct ModuleFile {
    /// The path as the process sees it (from maps).
    pub path: PathBuf,
    /// The file was deleted or replaced on disk after it was mapped.
    pub deleted: bool,
    pub inode: u64,
    /// Where to open the file: `/proc/PID/map_files/START-END` of one of its mappings.
    map_files: Option<PathBuf>,
    /// `/proc/PID/root`, to resolve paths in the process's mount namespace.
    root: Option<PathBuf>,
    file: OnceLock<Option<Arc<File>>>,
    /// The parsed object, once a symbolizer resolved it (or preset for in-memory objects).
    pub(crate) object: OnceLock<std::result::Result<Arc<ObjectInfo>, Arc<str>>>,
}

impl ModuleFile {
    /// The file name (last path component), used in `module+0xoffset` frames.
    pub fn name(&self) -> &str {
        self.path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("?")
    }

    /// `/proc/PID/root`, when the view came from a live process.
    pub fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    /// Opens the file once: through `/proc/PID/map_files` when readable (works for deleted
    /// or replaced files), else through `/proc/PID/root`, else the path itself. Paths are
    /// only used when the inode still matches what was mapped.
    pub fn open(&self) -> Option<Arc<File>> {
        self.file
            .get_or_init(|| {
                if let Some(mf) = &self.map_files
                    && let Ok(f) = File::open(mf)
                {
                    return Some(Arc::new(f));
                }
                if self.deleted {
                    return None;
                }
                let mut candidates = Vec::new();
                if let Some(root) = &self.root {
                    candidates.push(root.join(self.path.strip_prefix("/").unwrap_or(&self.path)));
                }
                candidates.push(self.path.clone());
                candidates.into_iter().find_map(|p| {
                    let f = File::open(&p).ok()?;
                    let m = f.metadata().ok()?;
                    (m.is_file() && (self.inode == 0 || m.ino() == self.inode)).then(|| Arc::new(f))
                })
            })
            .clone()
    }

    /// Opens the file now, so it stays readable after the process exits or the file is
    /// deleted. Returns whether it could be opened.
    pub fn pin(&self) -> bool {
        self.open().is_some()
    }
}

/// One mapping of the view.
#[derive(Clone, Debug)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// Offset in the file of `start`.
    pub offset: u64,
    pub executable: bool,
    /// `None` for anonymous mappings (heap, stack, JIT code).
    pub module: Option<Arc<ModuleFile>>,
}

/// Where an absolute address lies.
#[derive(Clone, Debug)]
pub struct ModuleAddress<'a> {
    pub mapping: &'a Mapping,
    /// `address - start + offset`.
    pub file_offset: u64,
}

impl ModuleAddress<'_> {
    pub fn module(&self) -> Option<&Arc<ModuleFile>> {
        self.mapping.module.as_ref()
    }
}

/// An immutable snapshot of a process's mappings, sorted by address.
#[derive(Clone, Debug, Default)]
pub struct ProcessView {
    pid: Option<u32>,
    mappings: Vec<Mapping>,
    caches: ViewCaches,
}

/// What is known about addresses of one view (an address space that does not change): the
/// unwind rule row and the symbolized frames of each code address, computed once. A stream of
/// stacks from one process visits the same few hundred addresses over and over.
#[derive(Debug, Default)]
pub(crate) struct ViewCaches {
    rows: Mutex<HashMap<u64, Option<Arc<UnwindRow>>, AddrHash>>,
    frames: Mutex<FramesByAddress>,
}

/// (address, is a return address) -> its symbolized frames.
type FramesByAddress = HashMap<(u64, bool), Arc<[Frame]>, AddrHash>;

/// Hashing for keys that are code addresses (ours, not an attacker's): one multiply per word
/// instead of SipHash, which was a visible part of a cached unwind step.
type AddrHash = std::hash::BuildHasherDefault<AddrHasher>;

#[derive(Default)]
pub(crate) struct AddrHasher(u64);

impl std::hash::Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_u8(&mut self, v: u8) {
        self.write_u64(v as u64);
    }
}

/// Entries a cache may hold before it is emptied (a process with that much distinct code).
const CACHE_LIMIT: usize = 1 << 20;

impl Clone for ViewCaches {
    /// A clone starts empty (the caches are a speed-up, never state).
    fn clone(&self) -> Self {
        ViewCaches::default()
    }
}

impl ViewCaches {
    pub(crate) fn row(
        &self,
        addr: u64,
        compute: impl FnOnce() -> Option<UnwindRow>,
    ) -> Option<Arc<UnwindRow>> {
        if let Some(r) = self
            .rows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&addr)
        {
            return r.clone();
        }
        let row = compute().map(Arc::new);
        let mut rows = self.rows.lock().unwrap_or_else(|e| e.into_inner());
        if rows.len() >= CACHE_LIMIT {
            rows.clear();
        }
        rows.insert(addr, row.clone());
        row
    }

    pub(crate) fn frames(
        &self,
        key: (u64, bool),
        compute: impl FnOnce() -> Vec<Frame>,
    ) -> Arc<[Frame]> {
        if let Some(f) = self
            .frames
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return f.clone();
        }
        let frames: Arc<[Frame]> = compute().into();
        let mut all = self.frames.lock().unwrap_or_else(|e| e.into_inner());
        if all.len() >= CACHE_LIMIT {
            all.clear();
        }
        all.insert(key, frames.clone());
        frames
    }
}

impl ProcessView {
    /// Snapshots the maps of a live process. Files are opened lazily; call
    /// [`ProcessView::pin_all`] to open them right away.
    pub fn from_pid(pid: u32) -> Result<Self> {
        let entries = read_maps(pid)?;
        Ok(Self::build(Some(pid), &entries))
    }

    /// A view of maps text captured earlier (files are opened by path, not through /proc).
    pub fn from_maps_text(text: &str) -> Self {
        Self::build(None, &parse_maps(text))
    }

    /// A view of parsed maps entries; with `pid`, files are opened through `/proc/PID/`.
    pub fn from_entries(pid: Option<u32>, entries: &[MapEntry]) -> Self {
        Self::build(pid, entries)
    }

    /// A view with one executable mapping backed by an already parsed object (tests, fuzzing).
    pub fn with_object(
        name: &str,
        start: u64,
        end: u64,
        offset: u64,
        object: Arc<ObjectInfo>,
    ) -> Self {
        let module = ModuleFile {
            path: PathBuf::from(name),
            deleted: false,
            inode: 0,
            map_files: None,
            root: None,
            file: OnceLock::from(None),
            object: OnceLock::from(Ok(object)),
        };
        ProcessView {
            pid: None,
            caches: ViewCaches::default(),
            mappings: vec![Mapping {
                start,
                end,
                offset,
                executable: true,
                module: Some(Arc::new(module)),
            }],
        }
    }

    fn build(pid: Option<u32>, entries: &[MapEntry]) -> Self {
        let mut modules: Vec<((String, u64, PathBuf), Arc<ModuleFile>)> = Vec::new();
        let mut mappings = Vec::with_capacity(entries.len());
        for e in entries {
            if e.end <= e.start {
                continue;
            }
            let module = e.path.as_ref().map(|path| {
                let key = (e.dev.clone(), e.inode, path.clone());
                if let Some((_, m)) = modules.iter().find(|(k, _)| *k == key) {
                    return m.clone();
                }
                let m = Arc::new(ModuleFile {
                    path: path.clone(),
                    deleted: e.deleted,
                    inode: e.inode,
                    map_files: pid.map(|p| e.map_files_path(p)),
                    root: pid.map(|p| PathBuf::from(format!("/proc/{p}/root"))),
                    file: OnceLock::new(),
                    object: OnceLock::new(),
                });
                modules.push((key, m.clone()));
                m
            });
            mappings.push(Mapping {
                start: e.start,
                end: e.end,
                offset: e.offset,
                executable: e.is_executable(),
                module,
            });
        }
        mappings.sort_by_key(|m| m.start);
        ProcessView {
            pid,
            mappings,
            caches: ViewCaches::default(),
        }
    }

    pub(crate) fn caches(&self) -> &ViewCaches {
        &self.caches
    }

    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    pub fn mappings(&self) -> &[Mapping] {
        &self.mappings
    }

    /// Opens every module file now (see [`ModuleFile::pin`]).
    pub fn pin_all(&self) {
        for m in self.mappings.iter().filter_map(|m| m.module.as_ref()) {
            m.pin();
        }
    }

    /// The mapping containing `addr`, with the file offset. O(log n).
    pub fn lookup(&self, addr: u64) -> Option<ModuleAddress<'_>> {
        let idx = self.mappings.partition_point(|m| m.start <= addr);
        let mapping = self.mappings[..idx].last()?;
        (addr < mapping.end).then(|| ModuleAddress {
            mapping,
            file_offset: (addr - mapping.start).wrapping_add(mapping.offset),
        })
    }

    /// True when `addr` lies in an executable mapping.
    pub fn is_executable(&self, addr: u64) -> bool {
        self.lookup(addr).is_some_and(|m| m.mapping.executable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_finds_mapping_and_file_offset() {
        let view = ProcessView::from_maps_text(
            "\
7f0000001000-7f0000002000 r-xp 00001000 fd:01 42 /lib/libx.so
7f0000000000-7f0000001000 r--p 00000000 fd:01 42 /lib/libx.so
7f0000003000-7f0000004000 rw-p 00000000 00:00 0
",
        );
        assert_eq!(view.mappings().len(), 3);
        let a = view.lookup(0x7f0000001234).unwrap();
        assert_eq!(a.file_offset, 0x1234);
        assert!(a.mapping.executable);
        assert_eq!(a.module().unwrap().name(), "libx.so");
        // Both mappings of the file share one module.
        let b = view.lookup(0x7f0000000010).unwrap();
        assert!(Arc::ptr_eq(a.module().unwrap(), b.module().unwrap()));
        assert!(view.lookup(0x7f0000003010).unwrap().module().is_none());
        assert!(view.lookup(0x7f0000002000).is_none());
        assert!(view.lookup(0).is_none());
        assert!(!view.is_executable(0x7f0000000010));
    }

    #[test]
    fn own_process_modules_open_through_map_files() {
        let view = ProcessView::from_pid(std::process::id()).unwrap();
        let f = own_process_modules_open_through_map_files as *const () as usize as u64;
        let m = view.lookup(f).unwrap();
        assert!(m.mapping.executable);
        assert!(m.module().unwrap().open().is_some());
    }
}
