//! Loading the BPF object and the operations user space performs on it: attach tracepoints
//! and uprobes, describe probes, add processes to the traced set, read the loss counters.

use std::path::Path;

use anyhow::{Context, Result, anyhow};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
    programs::{
        RawTracePoint, RawTracePointRunOptions, TestRun, TracePoint, UProbe,
        uprobe::{UProbeAttachPoint, UProbeScope},
    },
};
use probe_common::{ProbeSpec, TracepointOffsets, counter};

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
}

/// How often `flush_call_batches` asks a CPU whose batch is being changed again before it
/// gives up for this round (a program holds the batch for well under a microsecond).
const FLUSH_TRIES: usize = 1000;

impl Bpf {
    /// Loads the programs; `ring_bytes` must be a power of two multiple of the page size.
    pub fn load(offsets: &TracepointOffsets, ring_bytes: u32) -> Result<(Self, RingBuf<MapData>)> {
        bump_memlock_rlimit();
        let mut ebpf = EbpfLoader::new()
            .override_global("TP_OFFSETS", offsets, true)
            .map_max_entries("EVENTS", ring_bytes)
            // PENDING_STACKS is task-local storage, which aya 0.14 creates but has no type for;
            // only the BPF side uses it.
            .allow_unsupported_maps()
            .load(BPF_OBJECT)
            .context(
                "loading the BPF programs failed (are you root, with CAP_BPF and CAP_PERFMON?)",
            )?;
        for (prog, category, name) in [
            ("task_newtask", "task", "task_newtask"),
            ("process_exec", "sched", "sched_process_exec"),
            ("process_exit", "sched", "sched_process_exit"),
            ("enter_openat", "syscalls", "sys_enter_openat"),
            ("exit_openat", "syscalls", "sys_exit_openat"),
        ] {
            let tp: &mut TracePoint = program(&mut ebpf, prog)?.try_into()?;
            tp.load()
                .with_context(|| format!("verifier rejected {prog}"))?;
            tp.attach(category, name)
                .with_context(|| format!("cannot attach tracepoint {category}/{name}"))?;
        }
        for prog in [
            "call_entry",
            "call_return",
            "call_return_site",
            "hal_return",
            "noop_entry",
            "noop_return",
            "noop_return_site",
        ] {
            let up: &mut UProbe = program(&mut ebpf, prog)?.try_into()?;
            up.load()
                .with_context(|| format!("verifier rejected {prog}"))?;
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
        let mut bpf = Bpf {
            ebpf,
            stats: std::env::var_os(STATS_ENV)
                .and_then(|_| aya::sys::enable_stats(aya::sys::Stats::RunTime).ok()),
            noop_lib: noop_lib(),
            uprobe_programs: if std::env::var_os(NOOP_PROGRAMS_ENV).is_some() {
                NOOP_PROGRAMS
            } else {
                PROGRAMS
            },
            spec_copies: Default::default(),
            traced,
            known_paths,
            specs,
            counters,
            traced_gen,
            generation: 0,
            cpus,
            batching: false,
        };
        bpf.batching = bpf.run_flush();
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
    /// `file_offset` of the object at `path`, for all processes: the BPF side filters on the
    /// traced set, and an inode-wide probe also covers processes that map the file later.
    pub fn attach_uprobe(
        &mut self,
        path: &Path,
        file_offset: u64,
        probe: u16,
        with_return: bool,
    ) -> Result<()> {
        let (entry, ret, _, hal_ret) = self.programs_for(path);
        use probe_common::spec_flags as sf;
        let data_less = self.spec_copies.get(&probe).is_some_and(|s| {
            s.flags & sf::WANTS_RETURN != 0
                && s.flags & (sf::DATA_IS_STRING | sf::DATA_IS_BYTES | sf::NESTED) == 0
        });
        let ret = if data_less { hal_ret } else { ret };
        if with_return {
            // Attach the return probe first so no entry is stored without a return to pair it.
            self.attach_program(ret, path, file_offset, probe)?;
        }
        self.attach_program(entry, path, file_offset, probe)
    }

    /// An entry probe at `file_offset` whose return is seen by plain uprobes on the function's
    /// return instructions (`return_sites`, file offsets) instead of a uretprobe (`NESTED`
    /// probes only; see `call_return_site` in probe-ebpf).
    pub fn attach_uprobe_return_sites(
        &mut self,
        path: &Path,
        file_offset: u64,
        return_sites: &[u64],
        probe: u16,
    ) -> Result<()> {
        let (entry, _, site, _) = self.programs_for(path);
        for at in return_sites {
            self.attach_program(site, path, *at, probe)?;
        }
        self.attach_program(entry, path, file_offset, probe)
    }

    fn programs_for(&self, path: &Path) -> UprobePrograms {
        match &self.noop_lib {
            Some(noop) if std::fs::canonicalize(path).is_ok_and(|p| &p == noop) => NOOP_PROGRAMS,
            _ => self.uprobe_programs,
        }
    }

    fn attach_program(
        &mut self,
        prog: &'static str,
        path: &Path,
        file_offset: u64,
        probe: u16,
    ) -> Result<()> {
        let up: &mut UProbe = program(&mut self.ebpf, prog)?.try_into()?;
        let point = UProbeAttachPoint {
            location: file_offset.into(),
            cookie: Some(probe as u64),
        };
        // Links stay owned by the program; see `detach_in_background` for teardown.
        up.attach(point, path, UProbeScope::AllProcesses)
            .with_context(|| {
                format!(
                    "cannot attach {prog} at {}+{file_offset:#x}",
                    path.display()
                )
            })?;
        Ok(())
    }

    /// Adds a process (and, through the fork tracepoint, its future children) to the traced set.
    pub fn trace_process(&mut self, pid: u32) -> Result<()> {
        self.traced
            .insert(pid, 0, 0)
            .with_context(|| format!("cannot add pid {pid} to the traced set"))
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

    /// Marks a shared-object path (as a target would pass it to openat) as planned, so opening
    /// it does not stop the process (launch mode).
    pub fn mark_known_path(&mut self, path: &[u8]) {
        let _ = self.known_paths.insert(probe_common::path_hash(path), 1, 0);
    }

    pub fn forget_process(&mut self, pid: u32) {
        let _ = self.traced.remove(&pid);
        // Threads of `pid` that cached "traced" must look it up again.
        self.generation = self.generation.wrapping_add(1);
        let _ = self.traced_gen.set(0, self.generation, 0);
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

    /// Hands the teardown of every probe to a background process and returns at once.
    ///
    /// The kernel unregisters uprobes one at a time, waiting for a grace period each (~0.1 s
    /// here), so detaching a few dozen takes seconds. A forked child keeps its copies of the
    /// link descriptors until this process has exited, then exits itself, dropping the last
    /// references: the slow work happens after the caller is gone. Call it last, once all
    /// output is written; nothing is traced any more (the traced set is empty by then).
    pub fn detach_in_background(self) {
        let mut fds = [0; 2];
        // SAFETY: plain syscalls; the child only calls read, dup2, open and _exit.
        unsafe {
            if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                return; // falls back to detaching in the foreground (Drop)
            }
            let pid = libc::fork();
            if pid == 0 {
                libc::close(fds[1]);
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                for fd in 0..3 {
                    libc::dup2(null, fd);
                }
                let mut b = 0u8;
                // EOF once the parent (holding the write end) has exited.
                while libc::read(fds[0], (&mut b as *mut u8).cast(), 1) > 0 {}
                libc::_exit(0);
            }
            libc::close(fds[0]);
            if pid < 0 {
                libc::close(fds[1]);
                return;
            }
        }
        // The parent's descriptors close at exit, cheaply: the child still holds them.
        std::mem::forget(self);
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

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; raising it is harmless on newer ones.
fn bump_memlock_rlimit() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscall with a valid pointer.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) };
}
