//! Turning absolute addresses of a process into frames: function, `file:line`, inline chain.

use std::{
    collections::HashMap,
    fs::File,
    os::unix::fs::MetadataExt,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use anyhow::{Result, anyhow};

use crate::{
    object::{DebugSearch, ObjectInfo, Source, build_id_of},
    process::{ModuleFile, ProcessView},
};

/// One symbolized frame. An address inside inlined code yields several frames with the same
/// `address`: the inlined ones first (`inlined == true`), the real function last.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    /// The absolute address as captured (a return address for all but the first frame).
    pub address: u64,
    /// File name of the module, `None` when the address is in no file mapping.
    pub module: Option<String>,
    /// Offset of the address in the module file.
    pub module_offset: u64,
    /// Demangled function name; `None` when unknown (then print `module+0xoffset`).
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub inlined: bool,
}

/// Symbolizer settings.
#[derive(Clone, Debug)]
pub struct SymbolizerOptions {
    /// Global debug-file roots searched for `.gnu_debuglink` targets and
    /// `.build-id/xx/rest.debug` files. Default: `/usr/lib/debug`.
    pub debug_dirs: Vec<PathBuf>,
}

impl Default for SymbolizerOptions {
    fn default() -> Self {
        SymbolizerOptions {
            debug_dirs: vec![PathBuf::from("/usr/lib/debug")],
        }
    }
}

/// Identity of a file on disk, for objects without a build-id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct FileIdentity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
}

#[derive(Default)]
struct Cache {
    by_identity: HashMap<FileIdentity, Result<Arc<ObjectInfo>, Arc<str>>>,
    by_build_id: HashMap<Vec<u8>, Arc<ObjectInfo>>,
    /// The open file behind each parsed object (the descriptor the object reads through):
    /// tells when the file was deleted.
    files: HashMap<FileIdentity, Arc<File>>,
    parsed: usize,
}

impl Cache {
    /// Forgets the objects of files deleted since they were parsed: no process can map them
    /// again, and a view of one still alive keeps its own reference. Without this a node
    /// agent that runs for months holds an open descriptor and the symbols of every file it
    /// ever parsed (say, each kernel a JIT compiler wrote to /tmp and removed).
    fn drop_deleted(&mut self) {
        let gone: Vec<FileIdentity> = self
            .files
            .iter()
            .filter(|(_, f)| f.metadata().is_ok_and(|m| m.nlink() == 0))
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            self.files.remove(&id);
            self.by_identity.remove(&id);
        }
        // An object no file refers to any more leaves the build-id index too (files with
        // the same build-id share one object).
        let by_identity = &self.by_identity;
        self.by_build_id.retain(|_, o| {
            by_identity
                .values()
                .any(|r| matches!(r, Ok(x) if Arc::ptr_eq(x, o)))
        });
    }
}

/// Caches parsed objects (by build-id, else by dev+inode+size+mtime) so each is parsed once
/// per run. `Send + Sync`; lookups after the first parse are binary searches.
#[derive(Default)]
pub struct Symbolizer {
    options: SymbolizerOptions,
    cache: Mutex<Cache>,
}

/// Cache statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Objects parsed (each distinct object once).
    pub objects_parsed: usize,
    /// Distinct files seen.
    pub files: usize,
}

impl Symbolizer {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_options(options: SymbolizerOptions) -> Self {
        Symbolizer {
            options,
            cache: Mutex::default(),
        }
    }

    pub fn stats(&self) -> CacheStats {
        let c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        CacheStats {
            objects_parsed: c.parsed,
            files: c.by_identity.len(),
        }
    }

    /// The parsed object behind a module file, parsing it on first use.
    pub fn object(&self, module: &ModuleFile) -> Result<Arc<ObjectInfo>> {
        module
            .object
            .get_or_init(|| self.load(module).map_err(|e| Arc::from(format!("{e:#}"))))
            .clone()
            .map_err(|e| anyhow!("{e}"))
    }

    fn load(&self, module: &ModuleFile) -> Result<Arc<ObjectInfo>> {
        let file = module
            .open()
            .ok_or_else(|| anyhow!("cannot open {}", module.path.display()))?;
        let meta = file.metadata()?;
        let id = FileIdentity {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
        };
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = cache.by_identity.get(&id) {
            return r.clone().map_err(|e| anyhow!("{e}"));
        }
        cache.drop_deleted();
        let source = Source::File(file.clone());
        let build_id = build_id_of(&source);
        if let Some(obj) = build_id
            .as_ref()
            .and_then(|b| cache.by_build_id.get(b))
            .cloned()
        {
            cache.files.insert(id.clone(), file);
            cache.by_identity.insert(id, Ok(obj.clone()));
            return Ok(obj);
        }
        let search = DebugSearch {
            object_path: Some(module.path.clone()),
            root: module.root().map(PathBuf::from),
            debug_dirs: self.options.debug_dirs.clone(),
        };
        let result = ObjectInfo::load(source, &search).map(Arc::new);
        cache.parsed += 1;
        if result.is_ok() {
            cache.files.insert(id.clone(), file);
        }
        if let Ok(obj) = &result
            && let Some(b) = obj.build_id()
        {
            cache.by_build_id.insert(b.to_vec(), obj.clone());
        }
        let stored = result
            .as_ref()
            .map(Arc::clone)
            .map_err(|e| Arc::<str>::from(format!("{e:#}")));
        cache.by_identity.insert(id, stored);
        result
    }

    /// Symbolizes one absolute address. `return_address` says the address was read from the
    /// stack (it follows a call): it is then looked up as `address - 1` so that the frame
    /// shows the call site, not the next line.
    pub fn symbolize(&self, view: &ProcessView, address: u64, return_address: bool) -> Vec<Frame> {
        let Some(loc) = view.lookup(address) else {
            return vec![Frame {
                address,
                ..Frame::default()
            }];
        };
        let Some(module) = loc.module() else {
            return vec![Frame {
                address,
                module: None,
                module_offset: loc.file_offset,
                ..Frame::default()
            }];
        };
        let fallback = || {
            vec![Frame {
                address,
                module: Some(module.name().to_string()),
                module_offset: loc.file_offset,
                ..Frame::default()
            }]
        };
        let Ok(obj) = self.object(module) else {
            return fallback();
        };
        let probe = if return_address {
            loc.file_offset.saturating_sub(1)
        } else {
            loc.file_offset
        };
        let Some(vaddr) = obj.file_offset_to_vaddr(probe) else {
            return fallback();
        };
        let frames: Vec<Frame> = obj
            .symbolize(vaddr)
            .into_iter()
            .map(|f| Frame {
                address,
                module: Some(module.name().to_string()),
                module_offset: loc.file_offset,
                function: f.function,
                file: f.file,
                line: f.line,
                inlined: f.inlined,
            })
            .collect();
        if frames
            .iter()
            .all(|f| f.function.is_none() && f.file.is_none())
        {
            return fallback();
        }
        frames
    }

    /// Symbolizes a stack innermost first: `pcs[0]` is the exact pc, the rest are return
    /// addresses.
    pub fn symbolize_stack(&self, view: &ProcessView, pcs: &[u64]) -> Vec<Frame> {
        pcs.iter()
            .enumerate()
            .flat_map(|(i, &pc)| self.symbolize_shared(view, pc, i > 0).to_vec())
            .collect()
    }

    /// [`symbolize`](Self::symbolize), computed once per address of a view and shared: the
    /// stacks of one process visit the same addresses over and over. Use one symbolizer per
    /// view (the view keeps the result, whatever symbolizer computed it).
    pub fn symbolize_shared(
        &self,
        view: &ProcessView,
        address: u64,
        return_address: bool,
    ) -> Arc<[Frame]> {
        view.caches().frames((address, return_address), || {
            self.symbolize(view, address, return_address)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn symbolizer_and_views_can_be_shared_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Symbolizer>();
        assert_send_sync::<ProcessView>();
        assert_send_sync::<ObjectInfo>();
    }

    /// A file deleted after it was parsed leaves the cache (and its descriptor is closed)
    /// once another object is parsed; a file still on disk stays.
    #[test]
    fn objects_of_deleted_files_leave_the_cache() {
        let dir = std::env::temp_dir().join(format!("memscope-symcache-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let exe = fs::read("/proc/self/exe").unwrap();
        let symbolizer = Symbolizer::new();
        let parse = |name: &str| {
            let path = dir.join(name);
            fs::write(&path, &exe).unwrap();
            let ino = fs::metadata(&path).unwrap().ino();
            let view = ProcessView::from_maps_text(&format!(
                "7f0000000000-7f0000100000 r-xp 00000000 00:00 {ino} {}\n",
                path.display()
            ));
            let _ = symbolizer.symbolize(&view, 0x7f0000000100, false);
            path
        };
        let kept = parse("kept");
        let gone = parse("gone");
        assert_eq!(symbolizer.stats().files, 2);
        fs::remove_file(&gone).unwrap();
        parse("third");
        assert_eq!(
            symbolizer.stats().files,
            2,
            "the deleted file's object is gone"
        );
        assert!(kept.exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn address_outside_any_mapping_is_unknown() {
        let view = ProcessView::from_maps_text("");
        let frames = Symbolizer::new().symbolize(&view, 0x1234, false);
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].module, None);
        assert_eq!(frames[0].function, None);
    }
}
