//! Finding and identifying files: the target's search path (LD_LIBRARY_PATH, RUNPATH,
//! `$ORIGIN`, the ld.so cache, default and Ascend directories), file identity, and the
//! planner's cache of parsed ELF objects keyed by it.

use super::{Planner, planner_lookup};
use crate::trace::bpf::{Bpf, FileInode};
use crate::trace::probes;
use crate::trace::torch_npu;
use anyhow::Result;
use memscope_symbols::ElfObject;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::{ffi::OsStrExt, fs::MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(super) const DEFAULT_DIRS: [&str; 8] = [
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
];
pub(super) const ASCEND_DIRS: [&str; 5] = [
    "/usr/local/Ascend/driver/lib64",
    "/usr/local/Ascend/driver/lib64/driver",
    "/usr/local/Ascend/driver/lib64/common",
    "/usr/local/Ascend/ascend-toolkit/latest/lib64",
    "/usr/local/Ascend/ascend-toolkit/latest/runtime/lib64",
];

/// The environment a target resolves libraries with.
#[derive(Clone, Debug, Default)]
pub struct TargetEnv {
    pub ld_library_path: Vec<PathBuf>,
    pub ascend_home: Option<PathBuf>,
    /// Prefix for paths as the target sees them (`/proc/PID/root` for another mount namespace).
    pub root: Option<PathBuf>,
    /// The target's mount namespace (the `/proc/PID/ns/mnt` link's text), when it is a running
    /// process other than our own child.
    pub mount_ns: Option<PathBuf>,
}

impl TargetEnv {
    /// Our own environment (launch mode: the target inherits it).
    pub fn current() -> Self {
        TargetEnv {
            ld_library_path: std::env::var_os("LD_LIBRARY_PATH")
                .map(|v| split_paths(v.as_bytes()))
                .unwrap_or_default(),
            ascend_home: std::env::var_os("ASCEND_HOME_PATH").map(PathBuf::from),
            root: None,
            mount_ns: None,
        }
    }

    /// A running process's environment, from `/proc/PID/environ`, with its paths as in
    /// [`TargetEnv::of_process_root`].
    pub fn of_process(pid: u32) -> Self {
        let mut env = Self::of_process_root(pid);
        if let Ok(bytes) = fs::read(format!("/proc/{pid}/environ")) {
            for var in bytes.split(|b| *b == 0) {
                if let Some(v) = var.strip_prefix(b"LD_LIBRARY_PATH=") {
                    env.ld_library_path = split_paths(v);
                } else if let Some(v) = var.strip_prefix(b"ASCEND_HOME_PATH=") {
                    env.ascend_home = Some(PathBuf::from(OsStr::from_bytes(v)));
                }
            }
        }
        env
    }

    /// The path to open for a path as the target names it.
    pub(super) fn host_path(&self, p: &Path) -> PathBuf {
        match &self.root {
            Some(root) if p.is_absolute() => {
                let joined = root.join(p.strip_prefix("/").unwrap_or(p));
                if joined.exists() {
                    joined
                } else {
                    p.to_path_buf()
                }
            }
            _ => p.to_path_buf(),
        }
    }
}

pub(super) fn split_paths(v: &[u8]) -> Vec<PathBuf> {
    v.split(|b| *b == b':' || *b == b';')
        .filter(|p| !p.is_empty())
        .map(|p| PathBuf::from(OsStr::from_bytes(p)))
        .collect()
}

/// What identifies a file's contents without reading it: a file rewritten in place gets new
/// modification and change times (the change time cannot be set back by anyone), one
/// replaced by a rename is another inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct FileId {
    pub(super) dev: u64,
    pub(super) ino: u64,
    pub(super) size: u64,
    pub(super) mtime_ns: i128,
    pub(super) ctime_ns: i128,
}

impl FileId {
    pub(super) fn of(meta: &fs::Metadata) -> Self {
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128,
            ctime_ns: meta.ctime() as i128 * 1_000_000_000 + meta.ctime_nsec() as i128,
        }
    }
}

impl Planner {
    /// Remembers that `host` (`shown` to the target) is the file of `meta`, for
    /// `forget_file`. A vendor library's file is watched for writes even if it gets no probes.
    pub(super) fn considered_by(
        &mut self,
        bpf: &mut Bpf,
        meta: &fs::Metadata,
        (host, shown): (&Path, &Path),
        explicit: bool,
    ) {
        let inode = FileInode {
            dev: meta.dev(),
            ino: meta.ino(),
        };
        let paths = self.paths_of.entry(inode).or_default();
        if paths.iter().any(|(h, s)| h == host && s == shown) {
            return;
        }
        paths.push((host.to_path_buf(), shown.to_path_buf()));
        let name = shown.file_name().unwrap_or_default().to_string_lossy();
        if explicit || probes::is_known_library(&name) || torch_npu::is_library(&name) {
            bpf.watch_file(host);
        }
    }

    /// A watched file written in place (`bpf/changes.rs`), its probes gone: everything known of
    /// it goes, so the next open or mapping of any of its paths plans it again, and in launch
    /// mode stops the process until then.
    pub fn forget_file(&mut self, bpf: &mut Bpf, inode: FileInode) {
        let this = |id: &FileId| id.dev == inode.dev && id.ino == inode.ino;
        self.seen_files.retain(|id| !this(id));
        self.elf_cache.retain(|(id, _), _| !this(id));
        self.torch_npu_sites.retain(|id, _| !this(id));
        for (host, shown) in self.paths_of.remove(&inode).unwrap_or_default() {
            self.seen_paths.remove(&host);
            bpf.forget_known_path(shown.as_os_str().as_bytes());
        }
    }

    pub(super) fn ld_cache(&mut self) -> &HashMap<String, PathBuf> {
        self.ld_cache.get_or_insert_with(read_ld_cache)
    }

    pub(super) fn parse(&mut self, host: &Path) -> Option<Arc<ElfObject>> {
        self.parse_or_error(host).ok()
    }

    /// The parsed object at `host`, parsed once per file identity (`FileId`): the same
    /// library under many paths or in many processes costs one parse, and a file replaced in
    /// place is parsed again. What was read is remembered across runs too (`lookups`).
    pub(super) fn parse_or_error(&mut self, host: &Path) -> Result<Arc<ElfObject>, String> {
        let meta =
            fs::metadata(host).map_err(|e| format!("cannot read {}: {e}", host.display()))?;
        self.parse_with(host, &meta)
    }

    /// As `parse_or_error`, `meta` being the file's metadata just read.
    pub(super) fn parse_with(
        &mut self,
        host: &Path,
        meta: &fs::Metadata,
    ) -> Result<Arc<ElfObject>, String> {
        let lookup = planner_lookup(host);
        let id = FileId::of(meta);
        // An op library's parse holds its operator functions too (never on disk).
        let key = (id, lookup.scan.is_some());
        if let Some(c) = self.elf_cache.get(&key) {
            return c.clone();
        }
        let remembered = if lookup.scan.is_none() {
            let found = self.lookups.get(&id);
            for w in std::mem::take(&mut self.lookups.warnings) {
                self.warn_once(w);
            }
            found
        } else {
            None
        };
        let parsed = match remembered {
            Some(obj) => Ok(Arc::new(obj)),
            None => {
                self.lookups.misses += 1;
                let (parsed, unchanged) = read_object(host, id, &lookup);
                let parsed = parsed.map(Arc::new);
                // Remembered only when the file did not change while it was read.
                if let Ok(obj) = &parsed
                    && lookup.scan.is_none()
                    && unchanged
                {
                    self.lookups.put(&id, obj);
                }
                parsed
            }
        };
        self.elf_cache.insert(key, parsed.clone());
        parsed
    }
}

/// Reads what `lookup` asks of the object at `host`, and whether it is the file of identity
/// `id` and did not change while it was read (both known from its open descriptor: no path
/// is looked up again).
fn read_object(
    host: &Path,
    id: FileId,
    lookup: &memscope_symbols::elf::Lookup,
) -> (Result<ElfObject, String>, bool) {
    let file = match fs::File::open(host) {
        Ok(f) => f,
        Err(e) => return (Err(format!("cannot read {}: {e}", host.display())), false),
    };
    let before = match file.metadata() {
        Ok(m) => m,
        Err(e) => return (Err(format!("cannot read {}: {e}", host.display())), false),
    };
    let parsed =
        ElfObject::read_lookup(&file, host, before.len(), lookup).map_err(|e| format!("{e:#}"));
    let unchanged =
        FileId::of(&before) == id && file.metadata().is_ok_and(|after| FileId::of(&after) == id);
    (parsed, unchanged)
}

impl TargetEnv {
    /// Paths as process `pid` sees them: through `/proc/PID/root`, unless it sees the files we
    /// see (same root, same mount namespace), where a path needs no detour through `/proc`
    /// (whose path walk costs several times a plain one: a directory of 200 plugins is 200).
    pub(super) fn of_process_root(pid: u32) -> Self {
        /// Our mount namespace (the link's text) and the identity of our root.
        type Ours = (Option<PathBuf>, Option<(u64, u64)>);
        static OURS: std::sync::OnceLock<Ours> = std::sync::OnceLock::new();
        let identity = |p: &Path| fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
        let (our_namespace, our_root) = OURS.get_or_init(|| {
            (
                fs::read_link("/proc/self/ns/mnt").ok(),
                identity(Path::new("/")),
            )
        });
        let root = PathBuf::from(format!("/proc/{pid}/root"));
        let mount_ns = fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
        let same_namespace = our_namespace.is_some() && mount_ns == *our_namespace;
        let same_root = our_root.is_some() && identity(&root) == *our_root;
        TargetEnv {
            root: (!(same_namespace && same_root)).then_some(root),
            mount_ns,
            ..Default::default()
        }
    }
}

pub(super) fn memchr_so(name: &[u8]) -> bool {
    name.windows(3).any(|w| w == b".so")
}

/// Expands `$ORIGIN` (and `${ORIGIN}`) against the directory of `object`.
pub(super) fn expand_origin(paths: &[String], object: &Path) -> Vec<PathBuf> {
    let origin = object
        .parent()
        .unwrap_or(Path::new("/"))
        .to_string_lossy()
        .into_owned();
    paths
        .iter()
        .map(|p| PathBuf::from(p.replace("${ORIGIN}", &origin).replace("$ORIGIN", &origin)))
        .collect()
}

/// `ldconfig -p`: library name -> path from /etc/ld.so.cache (empty if ldconfig is missing).
pub(super) fn read_ld_cache() -> HashMap<String, PathBuf> {
    let mut map = HashMap::new();
    for ldconfig in ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"] {
        let Ok(out) = std::process::Command::new(ldconfig).arg("-p").output() else {
            continue;
        };
        for line in String::from_utf8_lossy(&out.stdout).lines().skip(1) {
            let line = line.trim();
            let Some((name, rest)) = line.split_once(' ') else {
                continue;
            };
            let Some((_, path)) = rest.rsplit_once("=> ") else {
                continue;
            };
            if rest.contains("x86-64") || rest.contains("AArch64") || !rest.contains("libc6,") {
                map.entry(name.to_string())
                    .or_insert_with(|| PathBuf::from(path));
            }
        }
        break;
    }
    map
}

/// Finds a program the way execvp would (PATH search for names without a slash).
pub fn find_program(program: &OsStr) -> Option<PathBuf> {
    let p = Path::new(program);
    if program.as_bytes().contains(&b'/') {
        return p.is_file().then(|| p.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(p))
        .find(|c| c.is_file() && is_executable(c))
}

pub(super) fn is_executable(p: &Path) -> bool {
    fs::metadata(p)
        .map(|m| m.mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// For a `#!` script, the interpreter it names (so its libraries are planned too).
pub fn script_interpreter(program: &Path) -> Option<PathBuf> {
    let head = fs::read(program).ok()?;
    let line = head.strip_prefix(b"#!")?.split(|b| *b == b'\n').next()?;
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_whitespace();
    let interp = words.next()?;
    if interp.ends_with("/env") {
        return find_program(OsStr::new(words.next()?));
    }
    Some(PathBuf::from(interp))
}
