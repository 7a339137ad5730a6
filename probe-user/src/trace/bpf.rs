//! Loading the BPF object and the operations user space performs on it: attach tracepoints
//! and uprobes, describe probes, add processes to the traced set, read the loss counters.

use std::path::Path;

use anyhow::{Context, Result, anyhow};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
    programs::{
        RawTracePoint, RawTracePointRunOptions, TestRun, TracePoint, UProbe,
        uprobe::{UProbeAttachPoint, UProbeLinkId, UProbeScope},
    },
};
use probe_common::{ProbeSpec, TracepointOffsets, counter};

use crate::trace::bpf_log;
use crate::trace::multi_uprobe::{self, MultiPrograms};
pub use crate::trace::scope::{SCOPE_ENV, Scope, probe_scope};
pub use changes::{ChangedFile, FileInode};
pub use discovery::OPEN_TRACEPOINTS_ENV;
pub use preload::REFUSED_ENTRY_ENV;

mod changes;
mod detach;
mod discovery;
pub(crate) mod preload;
mod python;
#[cfg(test)]
mod stack_budget;
mod stack_choice;

static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/probe"));

/// Loss and health counters summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub ringbuf_full: u64,
    pub pending_full: u64,
    pub orphan_return: u64,
    pub traced_full: u64,
    /// Regions or references of mstx memory batches beyond what one call may emit.
    pub batch_dropped: u64,
    /// Stack samples sent without their stack copy (ring buffer over half full).
    pub stacks_shed: u64,
}

impl Counters {
    pub fn lost_events(&self) -> u64 {
        self.ringbuf_full + self.pending_full + self.batch_dropped
    }
}

/// Environment variable that turns on the kernel's run-time statistics of our programs and
/// reports each program's average cost at the end (benchmarks and tuning).
pub const STATS_ENV: &str = "MEMSCOPE_BPF_STATS";

/// Environment variable that makes the tracer attach programs that do nothing (benchmarks only).
pub const NOOP_PROGRAMS_ENV: &str = "MEMSCOPE_BPF_NOOP_PROGRAMS";

/// Environment variable naming one library whose probes get the programs that do nothing
/// while every other library gets the real ones: the bench compares two copies of the HAL,
/// one of each, called alternately by one loop (benchmarks only).
pub const NOOP_LIB_ENV: &str = "MEMSCOPE_BPF_NOOP_LIB";

/// Program names for (entry, return, return site, return of a call without data).
type UprobePrograms = (&'static str, &'static str, &'static str, &'static str);

const NOOP_PROGRAMS: UprobePrograms = (
    "noop_entry",
    "noop_return",
    "noop_return_site",
    "noop_return",
);
/// The uprobe programs that run at a function's return (uretprobes).
const RETURN_PROGRAMS: [&str; 3] = ["call_return", "hal_return", "noop_return"];

/// The part of an attach cookie that is the probe id.
pub const PROBE_ID_MASK: u64 = 0xffff;

/// A probe point: (file offset, attach cookie).
type Point = (u64, u64);

/// A `Scope::Traced` request, kept to be made again for processes that join later.
#[derive(Clone)]
struct ScopedRequest {
    prog: &'static str,
    path: std::path::PathBuf,
    inode: Option<FileInode>,
    points: Vec<(u64, u64)>,
}

/// A multi-uprobe link, with the file it is on (`changes.rs`).
type Link = (Option<FileInode>, std::os::fd::OwnedFd);

const PROGRAMS: UprobePrograms = (
    "call_entry",
    "call_return",
    "call_return_site",
    "hal_return",
);

pub struct Bpf {
    ebpf: Ebpf,
    /// The programs used for uprobes (`PROGRAMS`, or `NOOP_PROGRAMS` for the bench's floor).
    uprobe_programs: UprobePrograms,
    /// The specs given to `set_spec`: they choose the return program.
    spec_copies: std::collections::HashMap<u16, ProbeSpec>,
    /// `MEMSCOPE_BPF_NOOP_LIB`, resolved.
    noop_lib: Option<std::path::PathBuf>,
    /// Kernel run-time statistics of the programs (`MEMSCOPE_BPF_STATS=1`), on while held.
    stats: Option<std::os::fd::OwnedFd>,
    traced: HashMap<MapData, u32, u32>,
    known_paths: HashMap<MapData, u64, u8>,
    specs: Array<MapData, ProbeSpec>,
    counters: PerCpuArray<MapData, u64>,
    /// Bumped after every removal from `traced` (see `TRACED_GEN` in probe-ebpf).
    traced_gen: Array<MapData, u32>,
    generation: u32,
    /// CPUs whose call batches `flush_call_batches` sends.
    cpus: Vec<u32>,
    /// Calls are batched per CPU (`flush_calls` ran on every CPU at load).
    batching: bool,
    /// The uprobe programs loaded for multi-uprobe links; None: per-probe perf links.
    multi: Option<MultiPrograms>,
    /// Multi-uprobe links (perf links stay owned by aya's programs).
    links: Vec<Link>,
    /// Perf links, by file and program, so a file written in place loses them.
    perf_links: Vec<(Option<FileInode>, &'static str, UProbeLinkId)>,
    /// Probed files watched for writes.
    changes: changes::ChangeWatch,
    /// What `Scope::Traced` attached, for processes that join later.
    scoped_requests: Vec<ScopedRequest>,
    /// Multi-uprobe links of each process in scope (`Scope::Traced`).
    process_links: std::collections::HashMap<u32, Vec<Link>>,
    /// The link on each Python process's `code_dealloc` (`watch_code_deaths`).
    code_gone_links: std::collections::HashMap<u32, std::os::fd::OwnedFd>,
    /// Threads closing links of processes that left; joined before the tracer exits.
    unlinking: Vec<std::thread::JoinHandle<()>>,
    /// The node agent's hold at vendor-library opens (`hold.rs`); None elsewhere.
    pub holds: Option<crate::trace::hold::Holds>,
    /// The holds at opens every tracer on the node shares (`holders.rs`).
    pub holders: crate::trace::holders::Holders,
}

/// How often `flush_call_batches` asks a CPU whose batch is being changed again before it
/// gives up for this round (a program holds the batch for well under a microsecond).
const FLUSH_TRIES: usize = 1000;

impl Bpf {
    /// Loads the programs; `ring_bytes` must be a power of two multiple of the page size.
    pub fn load(offsets: &TracepointOffsets, ring_bytes: u32) -> Result<(Self, RingBuf<MapData>)> {
        bump_memlock_rlimit();
        let started = std::time::Instant::now();
        // `EbpfLoader::new` parses the kernel BTF for itself and cannot share it: the copy the
        // multi-uprobe programs need is parsed meanwhile on another thread (~50-80 ms each).
        let btf_thread = std::thread::spawn(|| aya::Btf::from_sys_fs().ok());
        let mut log_level = bpf_log::level();
        let pins = crate::trace::holders::prepare_pins()
            .map_err(|why| {
                crate::log::warn(&format!(
                    "holds are not shared with other tracers on this node ({why}): beside \
                     another memscope-bpf, a process may be continued before our probes are in place"
                ))
            })
            .ok();
        let pins = pins.as_ref().map(|(h, t)| (h.as_path(), t.as_path()));
        let mut ebpf = match load_tracing(offsets, ring_bytes, log_level, pins) {
            // The BPF side's log statements are more code for the verifier: they must never
            // cost the trace.
            Err(e) if log_level != 0 => {
                crate::log::debug(&format!(
                    "the BPF side's log does not load here ({e:#}): going on without it"
                ));
                log_level = 0;
                load_tracing(offsets, ring_bytes, 0, pins)?
            }
            loaded => loaded?,
        };
        let uprobe_programs =
            preload::with_test_refusal(if std::env::var_os(NOOP_PROGRAMS_ENV).is_some() {
                NOOP_PROGRAMS
            } else {
                PROGRAMS
            });
        let kernel_btf = btf_thread.join().ok().flatten();
        let discovery = discovery::attach(&mut ebpf, kernel_btf.as_ref())?;
        let multi = load_multi_programs(&ebpf, kernel_btf.as_ref(), uprobe_programs.0);
        if log_level != 0 {
            // After the multi-uprobe copies took their map fds: this takes AYA_LOGS from aya.
            bpf_log::forward(&mut ebpf)?;
        }
        let flush: &mut RawTracePoint = program(&mut ebpf, "flush_calls")?.try_into()?;
        flush.load().context("verifier rejected flush_calls")?;
        let cpus = aya::util::online_cpus()
            .map_err(|(path, e)| anyhow!("cannot read the online CPUs from {path}: {e}"))?;
        let ring = RingBuf::try_from(take_map(&mut ebpf, "EVENTS")?)?;
        let traced = HashMap::try_from(take_map(&mut ebpf, "TRACED")?)?;
        let known_paths = HashMap::try_from(take_map(&mut ebpf, "KNOWN_PATHS")?)?;
        let specs = Array::try_from(take_map(&mut ebpf, "PROBE_SPECS")?)?;
        let counters = PerCpuArray::try_from(take_map(&mut ebpf, "COUNTERS")?)?;
        let traced_gen = Array::try_from(take_map(&mut ebpf, "TRACED_GEN")?)?;
        let holders = crate::trace::holders::Holders::take(&mut ebpf, pins.is_some())?;
        let mut bpf = Bpf {
            ebpf,
            stats: std::env::var_os(STATS_ENV)
                .and_then(|_| aya::sys::enable_stats(aya::sys::Stats::RunTime).ok()),
            noop_lib: noop_lib(),
            uprobe_programs,
            spec_copies: Default::default(),
            traced,
            known_paths,
            specs,
            counters,
            traced_gen,
            generation: 0,
            cpus,
            batching: false,
            multi,
            links: Vec::new(),
            perf_links: Vec::new(),
            changes: changes::ChangeWatch::new(),
            scoped_requests: Vec::new(),
            process_links: Default::default(),
            code_gone_links: Default::default(),
            unlinking: Vec::new(),
            holds: None,
            holders,
        };
        // aya's copies where there are no multi-uprobe links: a refusal stops us here.
        bpf.load_uprobe_programs()?;
        bpf.batching = bpf.run_flush();
        crate::log::debug(&format!(
            "BPF programs loaded in {:.0} ms (library discovery: {discovery})",
            started.elapsed().as_secs_f64() * 1e3
        ));
        if bpf.batching {
            crate::log::debug(&format!(
                "calls are batched per CPU ({} CPUs)",
                bpf.cpus.len()
            ));
            let mut on: Array<&mut MapData, u32> = Array::try_from(
                bpf.ebpf
                    .map_mut("BATCHING")
                    .ok_or_else(|| anyhow!("BPF map BATCHING missing"))?,
            )?;
            on.set(0, 1, 0).context("cannot turn on call batching")?;
        } else {
            crate::log::debug("cannot run flush_calls on every CPU: calls are sent one by one");
        }
        Ok((bpf, ring))
    }

    pub fn set_spec(&mut self, probe: u16, spec: ProbeSpec) -> Result<()> {
        self.spec_copies.insert(probe, spec);
        self.specs
            .set(probe as u32, spec, 0)
            .with_context(|| format!("cannot store probe spec {probe}"))
    }

    /// Attaches the generic entry program (and the return program when `with_return`) at
    /// `file_offset` of the object at `path`; see [`Bpf::attach_many`].
    pub fn attach_uprobe(
        &mut self,
        path: &Path,
        file_offset: u64,
        probe: u16,
        with_return: bool,
        scope: Scope,
    ) -> Result<()> {
        self.attach_many(path, &[(file_offset, probe as u64)], with_return, scope)
    }

    /// Attaches the generic entry program (and the return program when `with_return`) at each
    /// `(file offset, cookie)` of `points` in the object at `path`: one multi-uprobe link per
    /// program where the kernel has them (see `multi_uprobe`), else one perf link per point.
    ///
    /// The cookie's low 16 bits are the probe id (`PROBE_SPECS` index); the BPF side masks
    /// them off and passes the upper bits through (`RawEvent::cookie_hi`). With
    /// `Scope::AllProcesses` the probes are inode-wide, so they also cover processes that map
    /// the file later; the BPF side filters on the traced set either way.
    pub fn attach_many(
        &mut self,
        path: &Path,
        points: &[(u64, u64)],
        with_return: bool,
        scope: Scope,
    ) -> Result<()> {
        if points.is_empty() {
            return Ok(());
        }
        let (entry, ret, _, hal_ret) = self.programs_for(path);
        if with_return {
            use probe_common::spec_flags as sf;
            // Returns of calls without data get the lean return program.
            let (lean, full): (Vec<Point>, Vec<Point>) = points.iter().partition(|(_, cookie)| {
                self.spec_copies
                    .get(&((cookie & PROBE_ID_MASK) as u16))
                    .is_some_and(|s| {
                        s.flags & sf::WANTS_RETURN != 0
                            && s.flags & (sf::DATA_IS_STRING | sf::DATA_IS_BYTES | sf::NESTED) == 0
                    })
            });
            // Return probes first so no entry is stored without a return to pair it.
            self.attach_points(hal_ret, path, &lean, scope)?;
            self.attach_points(ret, path, &full, scope)?;
        }
        self.attach_points(entry, path, points, scope)
    }

    /// An entry probe at `file_offset` whose return is seen by plain uprobes on the function's
    /// return instructions (`return_sites`, file offsets) instead of a uretprobe (`NESTED`
    /// probes only; see `call_return_site` in probe-ebpf).
    pub fn attach_uprobe_return_sites(
        &mut self,
        path: &Path,
        file_offset: u64,
        return_sites: &[u64],
        cookie: u64,
        scope: Scope,
    ) -> Result<()> {
        let (entry, _, site, _) = self.programs_for(path);
        // The return finds the entry's event, which carries the cookie's upper bits.
        let probe = cookie & PROBE_ID_MASK;
        let sites: Vec<(u64, u64)> = return_sites.iter().map(|at| (*at, probe)).collect();
        self.attach_points(site, path, &sites, scope)?;
        self.attach_points(entry, path, &[(file_offset, cookie)], scope)
    }

    /// Whether probes go through multi-uprobe links (false: one perf link per probe).
    pub fn uses_multi_links(&self) -> bool {
        self.multi.is_some()
    }

    fn programs_for(&self, path: &Path) -> UprobePrograms {
        match &self.noop_lib {
            Some(noop) if std::fs::canonicalize(path).is_ok_and(|p| &p == noop) => NOOP_PROGRAMS,
            _ => self.uprobe_programs,
        }
    }

    /// Puts `prog` at every point of `points`: one multi-uprobe link, or per-point perf links
    /// when the kernel has no multi-uprobe links or refuses this one.
    fn attach_points(
        &mut self,
        prog: &'static str,
        path: &Path,
        points: &[(u64, u64)],
        scope: Scope,
    ) -> Result<()> {
        if points.is_empty() {
            return Ok(());
        }
        // `/proc/PID/root/...` stops resolving when PID exits; a path as we see it does not.
        let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let path = canonical.as_path();
        let inode = FileInode::of(path);
        if let Some(inode) = inode {
            self.changes.watch(path, inode);
        }
        if scope == Scope::Traced {
            let pids: Vec<u32> = self.process_links.keys().copied().collect();
            for pid in pids {
                self.attach_for_process(prog, path, points, pid)?;
            }
            self.scoped_requests.push(ScopedRequest {
                prog,
                path: path.to_path_buf(),
                inode,
                points: points.to_vec(),
            });
            return Ok(());
        }
        let is_return = RETURN_PROGRAMS.contains(&prog);
        if let Some(multi) = &self.multi {
            let pid = match scope {
                Scope::AllProcesses | Scope::Traced => 0,
                Scope::Process(pid) => pid,
            };
            match multi.attach(prog, is_return, path, points, pid) {
                Ok(link) => {
                    self.links.push((inode, link));
                    return Ok(());
                }
                Err(e) if self.links.is_empty() => {
                    // The first link failed: the kernel may lack them altogether.
                    crate::log::debug(&format!(
                        "multi-uprobe link refused ({e}): one perf link per probe from now on"
                    ));
                    self.multi = None;
                }
                Err(e) => crate::log::debug(&format!(
                    "multi-uprobe link for {prog} on {} refused ({e}): one perf link per probe",
                    path.display()
                )),
            }
        }
        let aya_scope = match scope {
            Scope::AllProcesses | Scope::Traced => UProbeScope::AllProcesses,
            Scope::Process(pid) => match std::num::NonZeroU32::new(pid) {
                Some(pid) => UProbeScope::OneProcess(pid),
                None => UProbeScope::AllProcesses,
            },
        };
        let up: &mut UProbe = program(&mut self.ebpf, prog)?.try_into()?;
        if up.fd().is_err() {
            up.load()
                .with_context(|| format!("verifier rejected {prog}"))?;
        }
        for &(file_offset, cookie) in points {
            let point = UProbeAttachPoint {
                location: file_offset.into(),
                cookie: Some(cookie),
            };
            // Links stay owned by the program; see `detach_in_background` for teardown.
            let id = up.attach(point, path, aya_scope).with_context(|| {
                format!(
                    "cannot attach {prog} at {}+{file_offset:#x}",
                    path.display()
                )
            })?;
            self.perf_links.push((inode, prog, id));
        }
        Ok(())
    }

    /// `prog` at `points` of `path` for process `pid` only, its link kept with the process's.
    fn attach_for_process(
        &mut self,
        prog: &'static str,
        path: &Path,
        points: &[(u64, u64)],
        pid: u32,
    ) -> Result<()> {
        if let Some(multi) = &self.multi {
            let is_return = RETURN_PROGRAMS.contains(&prog);
            match multi.attach(prog, is_return, path, points, pid) {
                Ok(link) => {
                    let link = (FileInode::of(path), link);
                    self.process_links.entry(pid).or_default().push(link);
                    return Ok(());
                }
                // Gone already (or its /proc paths with it): nothing to probe.
                Err(_) if !crate::trace::target::process_alive(pid) => return Ok(()),
                Err(e)
                    if self.links.is_empty() && self.process_links.values().all(Vec::is_empty) =>
                {
                    crate::log::debug(&format!(
                        "multi-uprobe link refused ({e}): one perf link per probe from now on"
                    ));
                    self.multi = None;
                }
                Err(e) => crate::log::debug(&format!(
                    "multi-uprobe link for {prog} on {} refused ({e}): one perf link per probe",
                    path.display()
                )),
            }
        }
        // Perf links with a pid stay with aya's program until the end.
        match self.attach_points(prog, path, points, Scope::Process(pid)) {
            Err(_) if !crate::trace::target::process_alive(pid) => Ok(()),
            other => other,
        }
    }

    /// Puts every `Scope::Traced` probe made so far on process `pid` too (a new process of the
    /// traced tree). Idempotent.
    pub fn scope_process(&mut self, pid: u32) -> Result<()> {
        if self.process_links.contains_key(&pid) {
            return Ok(());
        }
        self.process_links.insert(pid, Vec::new());
        let requests = self.scoped_requests.clone();
        for r in requests {
            self.attach_for_process(r.prog, &r.path, &r.points, pid)?;
        }
        Ok(())
    }

    /// Whether `pid` has its own probes (`Scope::Traced`).
    pub fn is_scoped(&self, pid: u32) -> bool {
        self.process_links.contains_key(&pid)
    }

    /// Adds a process (and, through the fork tracepoint, its future children) to the traced
    /// set and puts the `Scope::Traced` probes on it.
    pub fn trace_process(&mut self, pid: u32) -> Result<()> {
        self.traced
            .insert(pid, 0, 0)
            .with_context(|| format!("cannot add pid {pid} to the traced set"))?;
        self.scope_process(pid)
    }

    /// Launch mode with per-process probes: a new process of the traced tree stops before its
    /// first instruction (`child_start` in probe-ebpf) and its FORK event says so, so its
    /// probes are in place before it runs. False (said at debug level) when the kernel hook is
    /// missing: such children get their probes a little after they start.
    pub fn hold_children(&mut self) -> bool {
        let held = (|| -> Result<()> {
            let prog: &mut RawTracePoint = program(&mut self.ebpf, "child_start")?.try_into()?;
            prog.load().context("verifier rejected child_start")?;
            prog.attach("sys_exit")
                .context("cannot attach child_start to raw_syscalls:sys_exit")?;
            let mut on: Array<&mut MapData, u32> = Array::try_from(
                self.ebpf
                    .map_mut("HOLD_CHILDREN")
                    .ok_or_else(|| anyhow!("BPF map HOLD_CHILDREN missing"))?,
            )?;
            on.set(0, 1, 0).context("cannot turn on holding children")?;
            Ok(())
        })();
        match held {
            Ok(()) => true,
            Err(e) => {
                crate::log::debug(&format!(
                    "new processes are not held for their probes ({e:#}): a child forked \
                     without exec may run a little untraced"
                ));
                false
            }
        }
    }

    /// The descriptor of the traced-process map (for the watchdog, which keeps it open).
    pub fn traced_map_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use aya::maps::IterableMap;
        use std::os::fd::AsFd;
        self.traced.map().fd().as_fd()
    }

    /// The processes currently traced (the BPF side drops a process when its last thread exits).
    pub fn traced_processes(&self) -> Vec<u32> {
        self.traced.keys().filter_map(Result::ok).collect()
    }

    /// A map of the loaded object that no other part took.
    pub fn take_map(&mut self, name: &str) -> Result<aya::maps::Map> {
        take_map(&mut self.ebpf, name)
    }

    /// Marks a shared-object path (as a target would pass it to openat) as planned, so opening
    /// it does not stop the process (launch mode).
    pub fn mark_known_path(&mut self, path: &[u8]) {
        let _ = self.known_paths.insert(probe_common::path_hash(path), 1, 0);
    }

    /// Undoes [`Bpf::mark_known_path`]: the file there must be planned again.
    pub fn forget_known_path(&mut self, path: &[u8]) {
        let _ = self.known_paths.remove(&probe_common::path_hash(path));
    }

    pub fn forget_process(&mut self, pid: u32) {
        self.drop_process_probes(pid);
        let _ = self.traced.remove(&pid);
        // Threads of `pid` that cached "traced" must look it up again.
        self.generation = self.generation.wrapping_add(1);
        let _ = self.traced_gen.set(0, self.generation, 0);
    }

    /// A map by name, for modules that own their maps (the agent's stack sampling).
    pub fn map_mut(&mut self, name: &str) -> Option<&mut aya::maps::Map> {
        self.ebpf.map_mut(name)
    }

    /// The CPUs `flush_call_batches` visits.
    pub fn cpu_count(&self) -> usize {
        self.cpus.len()
    }

    /// Sends every CPU's batch of finished calls to the ring buffer (`flush_calls` in
    /// probe-ebpf, run on each CPU). Returns false when a CPU's batch stayed busy: calls
    /// dated before this flush may then still be waiting there.
    pub fn flush_call_batches(&self) -> bool {
        !self.batching || self.run_flush()
    }

    /// Runs `flush_calls` on every CPU; false when one stayed busy or it could not run.
    fn run_flush(&self) -> bool {
        let Some(Ok(flush)) = self
            .ebpf
            .program("flush_calls")
            .map(<&RawTracePoint>::try_from)
        else {
            return false;
        };
        // Every CPU is asked even after one failed: each sent batch is progress.
        self.cpus.iter().fold(true, |complete, &cpu| {
            complete
                & (0..FLUSH_TRIES).any(|_| {
                    match flush.test_run(RawTracePointRunOptions {
                        cpu: Some(cpu),
                        ..Default::default()
                    }) {
                        Ok(r) => r.return_value == 0,
                        // Gone offline since we listed it: nothing new can be waiting there.
                        Err(aya::programs::ProgramError::SyscallError(e))
                            if e.io_error.raw_os_error() == Some(libc::ENXIO) =>
                        {
                            true
                        }
                        Err(_) => false,
                    }
                })
        })
    }

    /// (program, runs, total ns) of every program that ran, when statistics are on.
    pub fn program_stats(&self) -> Vec<(String, u64, u64)> {
        if self.stats.is_none() {
            return Vec::new();
        }
        self.ebpf
            .programs()
            .filter_map(|(name, p)| {
                let info = p.info().ok()?;
                let runs = info.run_count();
                (runs > 0).then(|| (name.to_string(), runs, info.run_time().as_nanos() as u64))
            })
            .collect()
    }

    pub fn counters(&self) -> Counters {
        let sum = |i: u32| -> u64 {
            self.counters
                .get(&i, 0)
                .map(|v| v.iter().sum())
                .unwrap_or(0)
        };
        Counters {
            ringbuf_full: sum(counter::RINGBUF_FULL),
            pending_full: sum(counter::PENDING_FULL),
            orphan_return: sum(counter::ORPHAN_RETURN),
            traced_full: sum(counter::TRACED_FULL),
            batch_dropped: sum(counter::BATCH_DROPPED),
            stacks_shed: sum(counter::STACKS_SHED),
        }
    }
}

const UPROBE_PROGRAMS: [&str; 8] = [
    "call_entry",
    "call_return",
    "call_return_site",
    "hal_return",
    "noop_entry",
    "noop_return",
    "noop_return_site",
    "py_code_gone",
];

/// Environment variable that keeps the tracer on per-probe perf links even where the kernel
/// has multi-uprobe links (benchmarks and tests compare the two).
pub const NO_MULTI_ENV: &str = "MEMSCOPE_BPF_NO_MULTI_UPROBE";

/// The uprobe programs loaded a second time for multi-uprobe links, sharing aya's maps, with
/// `entry` among them (the one [`preload`]'s test swaps in); None (said at debug level) where
/// the kernel cannot load them that way.
fn load_multi_programs(
    ebpf: &Ebpf,
    kernel_btf: Option<&aya::Btf>,
    entry: &'static str,
) -> Option<MultiPrograms> {
    if std::env::var_os(NO_MULTI_ENV).is_some() {
        crate::log::debug(&format!("{NO_MULTI_ENV}: one perf link per probe"));
        return None;
    }
    let started = std::time::Instant::now();
    let Some(kernel_btf) = kernel_btf else {
        crate::log::debug("no kernel BTF: one perf link per probe");
        return None;
    };
    let mut names = UPROBE_PROGRAMS.to_vec();
    if !names.contains(&entry) {
        names.push(entry);
    }
    let loaded = multi_uprobe::map_fds(ebpf)
        .and_then(|maps| MultiPrograms::load(BPF_OBJECT, &maps, &names, kernel_btf));
    match loaded {
        Ok(m) => {
            crate::log::debug(&format!(
                "uprobe programs loaded for multi-uprobe links in {:.1} ms",
                started.elapsed().as_secs_f64() * 1e3
            ));
            Some(m)
        }
        Err(e) => {
            crate::log::debug(&format!(
                "no multi-uprobe links ({e:#}): one perf link per probe"
            ));
            None
        }
    }
}

/// `MEMSCOPE_BPF_NOOP_LIB`, resolved; a path that does not resolve is said, not ignored
/// silently (a bench would measure the real programs on both sides).
fn noop_lib() -> Option<std::path::PathBuf> {
    let path = std::env::var_os(NOOP_LIB_ENV)?;
    match std::fs::canonicalize(&path) {
        Ok(p) => Some(p),
        Err(e) => {
            crate::log::warn(&format!(
                "{NOOP_LIB_ENV}={}: {e}; every library gets the real programs",
                std::path::Path::new(&path).display()
            ));
            None
        }
    }
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::programs::Program> {
    ebpf.program_mut(name)
        .ok_or_else(|| anyhow!("BPF program {name} missing from the object"))
}

fn take_map(ebpf: &mut Ebpf, name: &str) -> Result<aya::maps::Map> {
    ebpf.take_map(name)
        .ok_or_else(|| anyhow!("BPF map {name} missing from the object"))
}

/// Loads the BPF object, its log level set to `log_level` (0: off), and loads and attaches the
/// process-tree tracepoints (library discovery's are `discovery::attach`'s).
fn load_tracing(
    offsets: &TracepointOffsets,
    ring_bytes: u32,
    log_level: u8,
    holders_pins: Option<(&std::path::Path, &std::path::Path)>,
) -> Result<Ebpf> {
    // A stack sample's scratch space per CPU (66 KiB each), only when stacks are taken.
    let stack_slots = match offsets.capture_stacks {
        0 => 1,
        _ => aya::util::nr_cpus()
            .map_err(|(path, e)| anyhow!("cannot read the possible CPUs from {path}: {e}"))?
            as u32,
    };
    let mut loader = EbpfLoader::new();
    if let Some((holders, tracers)) = holders_pins {
        loader.map_pin_path("HOLDERS", holders);
        loader.map_pin_path("TRACERS", tracers);
    }
    let mut ebpf = loader
        .override_global("TP_OFFSETS", offsets, true)
        .override_global(aya_log::LEVEL, &log_level, true)
        .map_max_entries("EVENTS", ring_bytes)
        .map_max_entries("STACK_SCRATCH", stack_slots)
        // PENDING_STACKS is task-local storage, which aya 0.14 creates but has no type for;
        // only the BPF side uses it.
        .allow_unsupported_maps()
        .load(BPF_OBJECT)
        .context("loading the BPF programs failed (are you root, with CAP_BPF and CAP_PERFMON?)")?;
    for (prog, category, name) in [
        ("task_newtask", "task", "task_newtask"),
        ("process_exec", "sched", "sched_process_exec"),
        ("process_exit", "sched", "sched_process_exit"),
    ] {
        attach_tracepoint(&mut ebpf, prog, category, name)?;
    }
    Ok(ebpf)
}

/// Loads program `prog` and attaches it to tracepoint `category/name`.
fn attach_tracepoint(ebpf: &mut Ebpf, prog: &str, category: &str, name: &str) -> Result<()> {
    let tp: &mut TracePoint = program(ebpf, prog)?.try_into()?;
    tp.load()
        .with_context(|| format!("verifier rejected {prog}"))?;
    tp.attach(category, name)
        .with_context(|| format!("cannot attach tracepoint {category}/{name}"))?;
    Ok(())
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; raising it is harmless on newer ones.
fn bump_memlock_rlimit() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscall with a valid pointer.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) };
}
