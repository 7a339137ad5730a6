//! Attach planning: finding the objects that hold probed entry points and attaching to them.
//!
//! Uprobes are attached per file (inode), for all processes, and the BPF side filters on the
//! traced set. A probe on a file that no process has mapped yet costs nothing and fires as soon
//! as a traced process maps it, so the planner attaches *ahead of time* to every candidate it
//! can predict: the libraries already mapped, the DT_NEEDED closure of the program, and the
//! known vendor libraries anywhere on the target's search path (LD_LIBRARY_PATH, RUNPATH, the
//! ld.so cache, the default and Ascend install directories). Libraries it could not predict
//! (a dlopen of an unusual path) are caught when the target opens or maps them.
//!
//! Here: the planner's decisions; `attach/files.rs` finds files on the target's search path
//! and caches parsed objects by file identity, `attach/vendor.rs` handles the op-API libraries
//! and torch_npu.

mod files;
mod lookups;
mod siblings;
mod vendor;

pub use files::TargetEnv;
pub use files::find_program;
pub use files::script_interpreter;

use crate::trace::aclnn;
use crate::trace::bpf::{Bpf, FileInode, Scope};
use crate::trace::probes::{Home, KNOWN_LIBRARIES, PROBES};
use crate::trace::{placement, probes, torch_npu};
use anyhow::Result;
use files::{ASCEND_DIRS, DEFAULT_DIRS, FileId, expand_origin, memchr_so};
use memscope_symbols::{ElfObject, read_maps};
use std::collections::{HashMap, HashSet, VecDeque};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// One object that received probes.
#[derive(Clone, Debug)]
pub struct AttachedObject {
    pub path: PathBuf,
    pub symbols: Vec<&'static str>,
}

pub struct Planner {
    explicit: Vec<PathBuf>,
    /// Files probed, by device and inode (and change time: a deleted file's inode number
    /// reused by a new file, as container layers and test copies come and go, is another
    /// file), so one file reached by many paths (mount namespaces, bind mounts) is probed once.
    seen_files: HashSet<FileId>,
    seen_paths: HashSet<PathBuf>,
    /// The paths (as we see them, as the target names them) each file was considered by.
    paths_of: HashMap<FileInode, Vec<(PathBuf, PathBuf)>>,
    /// DT_NEEDED names already followed: the loader opens a name once per process (later
    /// objects needing it bind to the loaded one), so a stop need not resolve it again.
    needed_seen: HashSet<String>,
    /// Directories whose shared objects are planned while the process runs on (`plan_next`).
    later: siblings::Siblings,
    elf_cache: HashMap<(FileId, bool), Result<Arc<ElfObject>, String>>,
    /// What was read of each object, remembered across runs (on disk).
    lookups: lookups::LookupCache,
    /// Warnings already given (`warn_once`).
    warned: HashSet<String>,
    ld_cache: Option<HashMap<String, PathBuf>>,
    pub attached: Vec<AttachedObject>,
    /// Things the user should know (missing symbols, unreadable libraries), printed by the caller.
    pub warnings: Vec<String>,
    pub debug: Vec<String>,
    specs_loaded: bool,
    /// Attach the `exit()` hold (stacks in launch mode; see `ProbeId::LibcExit`).
    pub hold_at_exit: bool,
    /// Attach the `Py_FinalizeEx` hold (Python stacks in launch mode; `ProbeId::PyFinalize`).
    pub hold_at_python_exit: bool,
    /// Which processes the probes fire in.
    pub scope: Scope,
    /// Probe the op libraries' operator functions (`aclnn*`): only when their OP_LAUNCH rows
    /// are written (`--events` with launch, `--level` with op), since each call costs the
    /// traced thread two traps (entry and return).
    pub trace_ops: bool,
    /// torch_npu libraries analysed, by file identity (the analysis reads the whole file).
    torch_npu_sites: HashMap<FileId, Result<torch_npu::ReportSite, String>>,
    /// The node agent (which sees every exec on the host): a directory searched for the known
    /// libraries already, by (mount namespace, directory), is searched again only once its
    /// modification time changed (a file added, replaced or removed). Remembered by sets of
    /// directories, a build's compiler runs (each with its own `LD_LIBRARY_PATH`) were all
    /// searched anew: 42 `statx` per directory, 6-13% of the agent's CPU on a busy host.
    pub remember_searches: bool,
    searched: HashMap<(PathBuf, PathBuf), Option<std::time::SystemTime>>,
}

impl Planner {
    pub fn new(explicit: Vec<PathBuf>) -> Self {
        Planner {
            explicit,
            seen_files: HashSet::new(),
            seen_paths: HashSet::new(),
            paths_of: HashMap::new(),
            needed_seen: HashSet::new(),
            later: siblings::Siblings::default(),
            elf_cache: HashMap::new(),
            lookups: lookups::LookupCache::new(&planner_lookup(Path::new(""))),
            warned: HashSet::new(),
            ld_cache: None,
            attached: Vec::new(),
            warnings: Vec::new(),
            debug: Vec::new(),
            specs_loaded: false,
            hold_at_exit: false,
            hold_at_python_exit: false,
            scope: Scope::AllProcesses,
            trace_ops: true,
            torch_npu_sites: HashMap::new(),
            remember_searches: false,
            searched: HashMap::new(),
        }
    }

    fn load_specs(&mut self, bpf: &mut Bpf) -> Result<()> {
        if !self.specs_loaded {
            for p in &PROBES {
                bpf.set_spec(p.id as u16, p.spec)?;
            }
            self.specs_loaded = true;
        }
        Ok(())
    }

    /// Libraries given with `--lib`.
    pub fn attach_explicit(&mut self, bpf: &mut Bpf) -> Result<()> {
        for lib in self.explicit.clone() {
            self.consider(bpf, &lib, &lib)?;
        }
        Ok(())
    }

    /// Launch mode: everything the program will load that we can predict, before it runs.
    pub fn plan_launch(&mut self, bpf: &mut Bpf, program: &Path, env: &TargetEnv) -> Result<()> {
        let started = Instant::now();
        self.attach_explicit(bpf)?;
        let runpaths = self.attach_closure(bpf, program, env)?;
        self.attach_known_libraries(bpf, env, &runpaths)?;
        self.attach_python_extensions(bpf, program, env)?;
        self.said_how_long(started, &program.display().to_string());
        Ok(())
    }

    /// For `--log-level=debug`: what planning took, and how many objects it read so far.
    fn said_how_long(&mut self, started: Instant, what: &str) {
        self.debug.push(format!(
            "planned {what} in {:.1} ms ({} objects known in all; {} found in the ELF lookup \
             cache, {} read)",
            started.elapsed().as_secs_f64() * 1e3,
            self.elf_cache.len(),
            self.lookups.hits,
            self.lookups.misses
        ));
    }

    /// Attach mode: what the process has mapped, plus what it may load later.
    pub fn plan_process(&mut self, bpf: &mut Bpf, pid: u32) -> Result<()> {
        self.attach_explicit(bpf)?;
        let env = TargetEnv::of_process(pid);
        let started = Instant::now();
        let mut runpaths = Vec::new();
        self.scan_maps(bpf, pid, &mut runpaths)?;
        self.attach_known_libraries(bpf, &env, &runpaths)?;
        self.said_how_long(started, &format!("pid {pid}"));
        Ok(())
    }

    /// After an exec: the new program and its dependencies, with its own environment.
    pub fn on_exec(&mut self, bpf: &mut Bpf, pid: u32, path: &Path) -> Result<()> {
        let env = TargetEnv::of_process(pid);
        let exe = PathBuf::from(format!("/proc/{pid}/exe"));
        let target = if exe.exists() {
            exe
        } else {
            env.host_path(path)
        };
        self.attach_closure(bpf, &target, &env)?;
        let mut runpaths = Vec::new();
        if let Some(obj) = self.parse(&target) {
            runpaths = expand_origin(&obj.runpath, path);
        }
        self.attach_known_libraries(bpf, &env, &runpaths)?;
        self.scan_maps(bpf, pid, &mut Vec::new())
    }

    /// A traced process opened a file: if it is a shared object, it may be about to be mapped.
    pub fn on_open(&mut self, bpf: &mut Bpf, pid: u32, dfd: i32, path: &Path) -> Result<()> {
        let name = path.file_name().map(|n| n.as_bytes()).unwrap_or_default();
        if !memchr_so(name) {
            return Ok(());
        }
        let full = if path.is_absolute() {
            TargetEnv::of_process_root(pid).host_path(path)
        } else if dfd == libc::AT_FDCWD {
            PathBuf::from(format!("/proc/{pid}/cwd")).join(path)
        } else {
            PathBuf::from(format!("/proc/{pid}/fd/{dfd}")).join(path)
        };
        let first_time = !self.seen_paths.contains(&full);
        // A process that opens a queued object before its turn is ahead of the queue.
        self.later.opened(&full);
        self.consider(bpf, &full, path)?;
        if first_time && let Some(obj) = self.parse(&full) {
            // The loader opens its dependencies next, and each unplanned one would stop the
            // process again (launch mode): plan them while it is held for this one.
            if obj.needed.iter().any(|n| !self.needed_seen.contains(n)) {
                self.attach_closure_shown(bpf, &full, path, &TargetEnv::of_process(pid), true)?;
            }
            // Its siblings next (see `siblings`); a file that is not an ELF object (the
            // loader's `ld.so.cache`) says nothing of its directory.
            self.later.queue_dir_of(&full, path);
        }
        Ok(())
    }

    /// Whether objects wait for `plan_next`.
    pub fn has_later(&self) -> bool {
        !self.later.is_empty()
    }

    /// Takes one step of the work queued for later: lists a queued directory, or plans one
    /// of the objects queued. One it opens before its turn stops it as before, since a path
    /// is marked planned only once its probes are in place.
    pub fn plan_next(&mut self, bpf: &mut Bpf) -> Result<()> {
        if !self.later.list_next()
            && let Some((host, shown)) = self.later.pop()
        {
            self.consider(bpf, &host, &shown)?;
        }
        if self.later.is_empty()
            && let Some(since) = self.later.since.take()
        {
            self.said_how_long(since, "a directory's objects in the background");
        }
        Ok(())
    }

    /// At a stop (launch mode): the next objects of the queue too, while the process is held
    /// (listing a queued directory first). A process that overtook the background plan, or
    /// just resumed from the stop that queued its directory, would otherwise stop again at
    /// its next object: a stop costs it the signal, our wakeup and its own (0.1-0.3 ms),
    /// several objects' planning.
    pub fn plan_ahead_at_stop(&mut self, bpf: &mut Bpf) -> Result<()> {
        const AHEAD: usize = 2;
        let mut planned = 0;
        while planned < AHEAD && self.has_later() {
            if !self.later.has_unlisted() {
                planned += 1;
            }
            self.plan_next(bpf)?;
        }
        Ok(())
    }

    /// A Python interpreter imports its standard extension modules (`lib-dynload`) one by
    /// one: planned ahead, with what they link, none of them stops the program.
    fn attach_python_extensions(
        &mut self,
        bpf: &mut Bpf,
        program: &Path,
        env: &TargetEnv,
    ) -> Result<()> {
        let is_python = program
            .file_name()
            .is_some_and(|n| n.as_bytes().starts_with(b"python"));
        // A venv's python is a link to the base interpreter, whose prefix holds the modules.
        let Some(prefix) = is_python
            .then(|| fs::canonicalize(program).ok())
            .flatten()
            .and_then(|real| Some(real.parent()?.parent()?.to_path_buf()))
        else {
            return Ok(());
        };
        let Ok(lib) = fs::read_dir(prefix.join("lib")) else {
            return Ok(());
        };
        for version in lib.flatten() {
            if !version.file_name().as_bytes().starts_with(b"python") {
                continue;
            }
            let Ok(modules) = fs::read_dir(version.path().join("lib-dynload")) else {
                continue;
            };
            for module in modules.flatten() {
                let path = module.path();
                if memchr_so(module.file_name().as_bytes()) {
                    self.attach_closure(bpf, &path, env)?;
                }
            }
        }
        Ok(())
    }

    /// Looks for new file mappings of a process (libraries loaded by means we did not see).
    pub fn scan_maps(
        &mut self,
        bpf: &mut Bpf,
        pid: u32,
        runpaths: &mut Vec<PathBuf>,
    ) -> Result<()> {
        let Ok(maps) = read_maps(pid) else {
            return Ok(());
        };
        let env = TargetEnv::of_process_root(pid);
        for m in maps.iter().filter(|m| m.is_executable()) {
            let Some(path) = &m.path else { continue };
            let host = if m.deleted {
                m.map_files_path(pid)
            } else {
                env.host_path(path)
            };
            if self.seen_paths.contains(&host) {
                continue;
            }
            if let Some(obj) = self.parse(&host) {
                runpaths.extend(expand_origin(&obj.runpath, path));
                runpaths.extend(expand_origin(&obj.rpath, path));
            }
            self.consider(bpf, &host, path)?;
        }
        Ok(())
    }

    /// Attaches to `program` and its DT_NEEDED closure; returns the RUNPATH/RPATH directories
    /// seen on the way (a dlopen by name searches the caller's RUNPATH).
    fn attach_closure(
        &mut self,
        bpf: &mut Bpf,
        program: &Path,
        env: &TargetEnv,
    ) -> Result<Vec<PathBuf>> {
        self.attach_closure_shown(bpf, program, program, env, false)
    }

    /// As `attach_closure`, `shown` being the path as the target names it; `only_new`
    /// follows only DT_NEEDED names not followed before.
    fn attach_closure_shown(
        &mut self,
        bpf: &mut Bpf,
        program: &Path,
        shown: &Path,
        env: &TargetEnv,
        only_new: bool,
    ) -> Result<Vec<PathBuf>> {
        let mut dirs = Vec::new();
        let mut queue = VecDeque::from([(program.to_path_buf(), shown.to_path_buf())]);
        let mut visited = HashSet::new();
        while let Some((host, shown)) = queue.pop_front() {
            if !visited.insert(host.clone()) || visited.len() > 512 {
                continue;
            }
            let Some(obj) = self.parse(&host) else {
                continue;
            };
            self.consider(bpf, &host, &shown)?;
            let runpath = expand_origin(&obj.runpath, &shown);
            let rpath = if obj.runpath.is_empty() {
                expand_origin(&obj.rpath, &shown)
            } else {
                Vec::new()
            };
            dirs.extend(runpath.iter().cloned());
            dirs.extend(rpath.iter().cloned());
            for needed in &obj.needed {
                if !self.needed_seen.insert(needed.clone()) && only_new {
                    continue;
                }
                if let Some(found) = self.resolve_library(needed, &rpath, env, &runpath) {
                    queue.push_back((env.host_path(&found), found));
                }
            }
        }
        Ok(dirs)
    }

    fn attach_known_libraries(
        &mut self,
        bpf: &mut Bpf,
        env: &TargetEnv,
        extra_dirs: &[PathBuf],
    ) -> Result<()> {
        let mut dirs: Vec<PathBuf> = env.ld_library_path.clone();
        dirs.extend(extra_dirs.iter().cloned());
        if let Some(home) = &env.ascend_home {
            dirs.push(home.join("lib64"));
        }
        dirs.extend(ASCEND_DIRS.iter().map(PathBuf::from));
        dirs.extend(DEFAULT_DIRS.iter().map(PathBuf::from));
        dirs.push(PathBuf::from("/usr/local/lib"));
        for name in KNOWN_LIBRARIES {
            if let Some(p) = self.ld_cache().get(name).cloned() {
                dirs.push(p.parent().map(Path::to_path_buf).unwrap_or_default());
            }
        }
        // A library that appears later in a directory searched before is planned when opened.
        let ns = env.mount_ns.as_ref().filter(|_| self.remember_searches);
        let mut seen_dirs = HashSet::new();
        for dir in dirs {
            if !seen_dirs.insert(dir.clone()) {
                continue;
            }
            if let Some(ns) = ns {
                let modified = fs::metadata(env.host_path(&dir))
                    .and_then(|m| m.modified())
                    .ok();
                if self.searched.insert((ns.clone(), dir.clone()), modified) == Some(modified) {
                    continue;
                }
            }
            // The op libraries too: a framework dlopens them at its first operator, often
            // after `--pid` attached (attach mode never stops the target to catch that).
            for name in KNOWN_LIBRARIES.iter().chain(&aclnn::OP_LIBRARIES) {
                let shown = dir.join(name);
                let host = env.host_path(&shown);
                if host.is_file() {
                    self.consider(bpf, &host, &shown)?;
                }
            }
        }
        Ok(())
    }

    /// Where the dynamic loader would find `name` (the usual search order).
    fn resolve_library(
        &mut self,
        name: &str,
        rpath: &[PathBuf],
        env: &TargetEnv,
        runpath: &[PathBuf],
    ) -> Option<PathBuf> {
        if name.contains('/') {
            return Some(PathBuf::from(name));
        }
        let dirs = rpath
            .iter()
            .chain(env.ld_library_path.iter())
            .chain(runpath.iter())
            .cloned()
            .collect::<Vec<_>>();
        for d in dirs {
            let p = d.join(name);
            if env.host_path(&p).is_file() {
                return Some(p);
            }
        }
        if let Some(p) = self.ld_cache().get(name) {
            return Some(p.clone());
        }
        DEFAULT_DIRS
            .iter()
            .map(|d| Path::new(d).join(name))
            .find(|p| env.host_path(p).is_file())
    }

    /// Queues a warning for the user, once per text (a library seen under many paths or
    /// in many processes warns once).
    fn warn_once(&mut self, text: String) {
        if self.warned.insert(text.clone()) {
            self.warnings.push(text);
        }
    }

    /// Attaches every probe that belongs in the object at `host` (shown to users as `shown`),
    /// then marks `shown` planned: opening it needs no stop from then on (launch mode), so
    /// the mark comes only once its probes are in place (the process may be running). A
    /// path considered before was marked then (`shown` follows from `host`), and marks are
    /// taken back only when its file is written in place (`forget_file`): a second mark, a
    /// system call at each open of a planned object, is not made.
    pub fn consider(&mut self, bpf: &mut Bpf, host: &Path, shown: &Path) -> Result<()> {
        let new_path = !self.seen_paths.contains(host);
        let attached = self.attach_object(bpf, host, shown);
        if new_path {
            bpf.mark_known_path(shown.as_os_str().as_bytes());
        }
        attached
    }

    fn attach_object(&mut self, bpf: &mut Bpf, host: &Path, shown: &Path) -> Result<()> {
        self.load_specs(bpf)?;
        // A `--lib` file, at start or planned again (it was written in place).
        let explicit = self.explicit.iter().any(|e| e == shown);
        self.seen_paths.insert(host.to_path_buf());
        let meta = match fs::metadata(host) {
            Ok(m) => m,
            Err(e) => {
                if explicit {
                    self.warnings
                        .push(format!("cannot read library {}: {e}", shown.display()));
                }
                return Ok(());
            }
        };
        if !meta.is_file() {
            return Ok(());
        }
        self.considered_by(bpf, &meta, (host, shown), explicit);
        if !self.seen_files.insert(FileId::of(&meta)) {
            return Ok(());
        }
        let obj = match self.parse_with(host, &meta) {
            Ok(o) => o,
            Err(e) => {
                if explicit {
                    self.warn_once(format!("cannot use library {}: {e}", shown.display()));
                }
                return Ok(());
            }
        };
        let file_name = shown
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let is_known = probes::is_known_library(&file_name);
        let mut symbols = Vec::new();
        // Probes of this object, batched so that each program gets one link per object.
        let mut entry_only: Vec<(u64, u64, &'static str)> = Vec::new();
        let mut entry_and_return: Vec<(u64, u64, &'static str)> = Vec::new();
        let scope = self.scope;
        for p in &PROBES {
            if p.id == probes::ProbeId::LibcExit && !self.hold_at_exit {
                continue;
            }
            if matches!(p.id, probes::ProbeId::PyFinalize | probes::ProbeId::PyExit)
                && !self.hold_at_python_exit
            {
                continue;
            }
            let belongs = match p.home {
                Home::Library(lib) => explicit || probes::library_matches(&file_name, lib),
                Home::AnyExporter => true,
                Home::TorchNpu | Home::OpApi => false,
            };
            if !belongs || !obj.exports(p.symbol) {
                continue;
            }
            // MindSpore's pool: both of its functions or neither (blocks made but never freed
            // would all look leaked).
            if matches!(
                p.id,
                probes::ProbeId::MsAllocTensorMem | probes::ProbeId::MsFreeTensorMem
            ) && !(obj.exports(probes::MS_ALLOC_TENSOR_MEM)
                && obj.exports(probes::MS_FREE_TENSOR_MEM))
            {
                continue;
            }
            let Some(sym) = obj.function(p.symbol) else {
                continue;
            };
            // Entry and return probe share one point past a single-stepped prologue when that
            // is safe (placement.rs); the stack pointer is unchanged there, so the uretprobe
            // still finds the return address at [rsp].
            let place = placement::choose(host, sym.file_offset, sym.size);
            let offset = sym.file_offset + place.offset;
            self.debug.push(format!(
                "probe {} at {}+{:#x}{} ({})",
                p.symbol,
                shown.display(),
                offset,
                if p.wants_return() {
                    " (entry and return)"
                } else {
                    ""
                },
                place.describe()
            ));
            if p.wants_return() && p.spec.flags & probe_common::spec_flags::NESTED != 0 {
                // C++ entry points: return probes on the return instructions when they can
                // all be found, so an exception can unwind through the function.
                let mut parts = vec![(sym.file_offset, sym.size)];
                if let Some(cold) = obj.function(&format!("{}.cold", p.symbol)) {
                    parts.push((cold.file_offset, cold.size));
                }
                let (counters, warning) = ms_pool_counters(host, &obj, p.id);
                if p.id == probes::ProbeId::MsAllocTensorMem {
                    self.warnings.extend(warning);
                }
                let cookie = p.id as u64 | counters;
                let attached = match placement::return_sites(host, &parts) {
                    Ok(sites) => {
                        self.debug.push(format!(
                            "return of {} seen at {} return instruction(s)",
                            p.symbol,
                            sites.len()
                        ));
                        bpf.attach_uprobe_return_sites(host, offset, &sites, cookie, scope)
                    }
                    Err(why) => {
                        self.debug.push(format!(
                            "return of {} needs a uretprobe ({why}): a C++ exception thrown \
                             through it would end the program",
                            p.symbol
                        ));
                        bpf.attach_many(host, &[(offset, cookie)], true, scope)
                    }
                };
                match attached {
                    Ok(()) => symbols.push(p.symbol),
                    Err(e) => self.warnings.push(format!("{e:#}")),
                }
            } else if p.wants_return() {
                entry_and_return.push((offset, p.id as u64, p.symbol));
            } else {
                entry_only.push((offset, p.id as u64, p.symbol));
            }
        }
        for (batch, with_return) in [(entry_only, false), (entry_and_return, true)] {
            let points: Vec<(u64, u64)> = batch.iter().map(|(o, c, _)| (*o, *c)).collect();
            match bpf.attach_many(host, &points, with_return, scope) {
                Ok(()) => symbols.extend(batch.iter().map(|(_, _, name)| *name)),
                Err(e) => self.warnings.push(format!("{e:#}")),
            }
        }
        if self.trace_ops && aclnn::is_op_library(&file_name) {
            let ops = self.attach_op_api(bpf, host, shown, &obj);
            if ops > 0 {
                symbols.push("aclnn*");
            }
        }
        if torch_npu::is_library(&file_name)
            && let Some(symbol) = self.attach_torch_npu(bpf, host, shown, FileId::of(&meta))
        {
            symbols.push(symbol);
        }
        if probes::library_matches(&file_name, probes::MINDSPORE_POOL_LIBRARY)
            && !symbols.contains(&probes::MS_ALLOC_TENSOR_MEM)
        {
            self.warn_once(format!(
                "{}: MindSpore's pool functions (AbstractDynamicMemPool::AllocTensorMem and \
                 DoFreeTensorMem) are not both exported by this release: its tensor blocks are \
                 not traced (no MINDSPORE rows; the driver's rows are)",
                shown.display()
            ));
        }
        if is_known {
            for p in probes::expected_in(&file_name) {
                if !obj.exports(p.symbol) {
                    self.warn_once(format!(
                        "symbol {} not found in {}: its calls will not be traced",
                        p.symbol,
                        shown.display()
                    ));
                }
            }
        } else if explicit && symbols.is_empty() {
            self.warnings.push(format!(
                "library {} exports none of the probed functions",
                shown.display()
            ));
        }
        if !symbols.is_empty() {
            self.attached.push(AttachedObject {
                path: shown.to_path_buf(),
                symbols,
            });
        }
        Ok(())
    }
}

/// The cookie bits that tell a MindSpore pool probe where the pool counts its used bytes and,
/// without VMM, its reserved ones (`READ_CHAIN`; 0 for other probes, or when the used getter
/// is not the expected code). The warning: why the reserved bytes are not read.
fn ms_pool_counters(host: &Path, obj: &ElfObject, id: probes::ProbeId) -> (u64, Option<String>) {
    use super::mindspore::{TOTAL_RESERVED, TOTAL_USED, reserved_counters, used_counter};
    if !matches!(
        id,
        probes::ProbeId::MsAllocTensorMem | probes::ProbeId::MsFreeTensorMem
    ) {
        return (0, None);
    }
    let Some((member, used)) = obj
        .function(TOTAL_USED)
        .and_then(|getter| used_counter(host, getter))
    else {
        return (0, None);
    };
    // Read only through the same member as `used`: one more pair in the same chained read.
    let reserved = obj
        .function(TOTAL_RESERVED)
        .and_then(|getter| reserved_counters(host, getter))
        .filter(|&(m, _, _)| m == member);
    let sum = reserved.map(|(_, a, b)| (a as u64, b as u64));
    let packed = probe_common::read_chain::pack(member as u64, used as u64, sum)
        .or_else(|| probe_common::read_chain::pack(member as u64, used as u64, None));
    let warning = (reserved.is_none()
        || packed.is_some_and(|hi| probe_common::read_chain::sum(hi).is_none()))
    .then(|| {
        format!(
            "{}: TotalMemStatistics() is not the code this tracer reads; MindSpore's \
             total with --pid and VMM off counts only the driver memory taken after the attach",
            host.display()
        )
    });
    (
        packed.map_or(0, |hi| (hi as u64) << probe_common::COOKIE_HI_SHIFT),
        warning,
    )
}

/// The symbols the planner reads from the object at `host`: the probed functions (looked up
/// by hash, no pass over a large library's tables), the `.cold` parts of those whose returns
/// are seen at their return instructions, every operator function of an op library, and the
/// getters of MindSpore's pool counters (`ms_pool_counters`).
fn planner_lookup(host: &Path) -> memscope_symbols::elf::Lookup<'static> {
    static NAMES: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    let names = NAMES.get_or_init(|| {
        let mut names: Vec<&'static str> = PROBES.iter().map(|p| p.symbol).collect();
        names.push(super::mindspore::TOTAL_USED);
        names.push(super::mindspore::TOTAL_RESERVED);
        names.sort_unstable();
        names.dedup();
        names
    });
    let op_library = host
        .file_name()
        .is_some_and(|n| aclnn::is_op_library(&n.to_string_lossy()));
    memscope_symbols::elf::Lookup {
        names,
        scan: op_library.then_some(&aclnn::is_op_function as &dyn Fn(&str) -> bool),
        cold_of: &|name| {
            PROBES
                .iter()
                .any(|p| p.symbol == name && p.spec.flags & probe_common::spec_flags::NESTED != 0)
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use files::{read_ld_cache, split_paths};
    use std::ffi::OsStr;

    #[test]
    fn origin_and_path_lists() {
        let got = expand_origin(
            &["$ORIGIN/../lib".into(), "${ORIGIN}".into(), "/opt".into()],
            Path::new("/a/bin/prog"),
        );
        assert_eq!(
            got,
            [
                PathBuf::from("/a/bin/../lib"),
                PathBuf::from("/a/bin"),
                PathBuf::from("/opt")
            ]
        );
        assert_eq!(
            split_paths(b"/x::/y"),
            [PathBuf::from("/x"), PathBuf::from("/y")]
        );
        assert!(memchr_so(b"libfoo.so.1") && !memchr_so(b"data.json"));
    }

    #[test]
    fn finds_programs_and_interpreters() {
        assert!(find_program(OsStr::new("sh")).is_some());
        assert!(find_program(OsStr::new("no-such-program-memscope")).is_none());
        let dir = std::env::temp_dir().join(format!("memscope-attach-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let script = dir.join("run.sh");
        fs::write(&script, "#!/usr/bin/env sh\necho hi\n").unwrap();
        let interp = script_interpreter(&script).unwrap();
        assert!(interp.ends_with("sh"));
        fs::write(&script, "#!/bin/bash -e\n").unwrap();
        assert_eq!(
            script_interpreter(&script),
            Some(PathBuf::from("/bin/bash"))
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn ld_cache_has_libc() {
        let cache = read_ld_cache();
        if !cache.is_empty() {
            assert!(cache.contains_key("libc.so.6"));
        }
    }
}
