//! What the agent knows about each process, and the session observer that keeps it.
//!
//! The session's per-process trackers (`state::ProcessState`) stay the source of truth; this
//! observer reads them every snapshot interval into a small [`ProcessSnapshot`] per process
//! (bytes by device and owner, peaks, leak suspects, the heap by stack) that the HTTP side
//! serves. Counters that must be exact (allocations, frees, allocated bytes) are counted on
//! every event. A process that exits keeps its final snapshot for `--keep-exited`, then goes.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use crate::{
    events::decode::{Call, CallEvent},
    log,
    output::snapshot::{self, SnapshotRecorder},
    output::{DeviceKey, Row},
    session::Observer,
    state::{AddrHash, Block, ProcessState},
};

use super::{cgroup::Container, sampling::Sampler};

/// Distinct allocation stacks remembered per process for `alloc_*`; more are merged into
/// [`OTHER_STACKS`] so memory stays bounded.
const MAX_STACKS_PER_PROCESS: usize = 4096;
pub const OTHER_STACKS: &str = "0x0000000000000000 [other stacks]";

/// Bytes and blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Amount {
    pub bytes: u64,
    pub blocks: u64,
}

/// (device, owner): device as in the dumps (`0`, `cpu`), owner as `Block::owner()`.
pub type DeviceOwner = (String, String);

/// One heap-profile entry: a stack and its sampled in-use and allocated amounts, scaled by
/// the inverse of each allocation's sampling probability.
#[derive(Clone, Debug, Default)]
pub struct HeapEntry {
    pub inuse_objects: f64,
    pub inuse_bytes: f64,
    pub alloc_objects: f64,
    pub alloc_bytes: f64,
}

#[derive(Clone, Debug, Default)]
pub struct ProcessSnapshot {
    pub pid: u32,
    pub comm: String,
    /// Its container and pod, from its cgroup (`cgroup.rs`).
    pub container: Container,
    /// When the process exited (its numbers are then final).
    pub exited: Option<Instant>,
    pub step: u32,
    pub live: BTreeMap<DeviceOwner, Amount>,
    /// Highest total live bytes per device after any one event (exact).
    pub peak: BTreeMap<String, u64>,
    /// Blocks live `--leak-steps` steps after the step they were allocated in.
    pub suspects: BTreeMap<DeviceOwner, Amount>,
    /// Successful allocations and frees (driver blocks, handles, pool regions): exact.
    pub allocations: u64,
    pub frees: u64,
    /// Bytes of every allocation, per device: exact.
    pub allocated_bytes: BTreeMap<String, u64>,
    /// Heap profile by stack text (innermost frame first, `docs/call-stacks.md`).
    pub heap: HashMap<Arc<str>, HeapEntry>,
}

/// The agent's own counters, exported as self-metrics.
#[derive(Default)]
pub struct AgentCounters {
    pub sampled_stacks: AtomicU64,
    pub unsampled_allocations: AtomicU64,
    /// Sampled allocations whose stack was not unwound: too much was waiting for the unwinder
    /// (`events::stacks::DROPPED_STACK`; their bytes stay in the profile under that frame).
    pub dropped_stacks: AtomicU64,
    pub processes_seen: AtomicU64,
    /// Holds at a vendor library's open (`trace::hold`), those the watchdog ended, and
    /// their total time.
    pub holds: AtomicU64,
    pub holds_by_watchdog: AtomicU64,
    pub hold_ns: AtomicU64,
}

/// What the HTTP side reads.
#[derive(Default)]
pub struct Shared {
    pub processes: Mutex<BTreeMap<u32, ProcessSnapshot>>,
    pub ready: AtomicBool,
    pub counters: AgentCounters,
    /// Events seen and lost by the BPF side, updated at each snapshot.
    pub events: AtomicU64,
    pub lost: AtomicU64,
    /// `--memory-snapshot`: each live process's PyTorch memory snapshot
    /// (/debug/memory_snapshot?pid=PID).
    pub memory_snapshots: Option<Mutex<HashMap<u32, SnapshotRecorder>>>,
}

/// One device's exact counters in a process.
#[derive(Default)]
struct DeviceCounters {
    /// Live bytes, kept from every MALLOC and FREE row.
    live: u64,
    /// Their highest value (None: no allocation and no live block seen on the device yet).
    peak: Option<u64>,
    /// Bytes of every allocation (None: none yet).
    allocated: Option<u64>,
}

/// Per-process counters kept between snapshots (by device key: no device name is made per
/// event).
struct Tracked {
    comm: String,
    container: Container,
    /// Per device: one map lookup per MALLOC or FREE row.
    devices: BTreeMap<DeviceKey, DeviceCounters>,
    alloc_by_stack: HashMap<Arc<str>, (f64, f64)>,
}

pub struct AgentObserver {
    shared: Arc<Shared>,
    sampler: Sampler,
    leak_steps: u32,
    snapshot_every: Duration,
    last_snapshot: Instant,
    keep_exited: Duration,
    max_exited: usize,
    tracked: HashMap<u32, Tracked, AddrHash>,
    /// Names and containers read while a process was held at a vendor library's open, for when it is
    /// picked up (a short job may be gone by its first call's arrival). Bounded.
    held_names: HashMap<u32, (String, Container), AddrHash>,
    /// The pid `received` last made sure of.
    last_received: Option<u32>,
    other: Arc<str>,
}

impl AgentObserver {
    pub fn new(shared: Arc<Shared>, opts: &super::options::AgentOptions) -> Self {
        AgentObserver {
            shared,
            sampler: Sampler::new(opts.sample_bytes),
            leak_steps: opts.leak_steps,
            snapshot_every: opts.snapshot,
            last_snapshot: Instant::now(),
            keep_exited: opts.keep_exited,
            max_exited: opts.max_exited,
            tracked: HashMap::default(),
            held_names: HashMap::default(),
            last_received: None,
            other: Arc::from(OTHER_STACKS),
        }
    }

    fn tracked(&mut self, pid: u32) -> &mut Tracked {
        tracked_entry(&mut self.tracked, &mut self.held_names, &self.shared, pid)
    }

    fn snapshot(&mut self, state: &ProcessState) -> ProcessSnapshot {
        let leak_steps = self.leak_steps;
        let sampler = self.sampler;
        let t = self.tracked(state.pid);
        let step = state.step();
        let mut live: BTreeMap<DeviceOwner, Amount> = BTreeMap::new();
        let mut suspects: BTreeMap<DeviceOwner, Amount> = BTreeMap::new();
        let mut heap: HashMap<Arc<str>, HeapEntry> = HashMap::new();
        let mut device_total: BTreeMap<DeviceKey, u64> = BTreeMap::new();
        state.for_each_live_block(|b: &Block| {
            let device = DeviceKey::from_id(b.device);
            let key = (device.to_string(), b.owner());
            add(live.entry(key.clone()).or_default(), b.size);
            *device_total.entry(device).or_default() += b.size;
            // Step 0 is before the first step: pools and weights set up once are no leak; nor
            // is a pool's segment, which it keeps on purpose (its tensors are what can leak).
            if b.step > 0 && step >= b.step + leak_steps && !state.is_pool_segment(b) {
                add(suspects.entry(key).or_default(), b.size);
            }
            if let Some(stack) = &b.stack {
                let w = sampler.weight(b.size);
                let e = heap.entry(stack.clone()).or_default();
                e.inuse_objects += w;
                e.inuse_bytes += w * b.size as f64;
            }
        });
        for (dev, bytes) in device_total {
            let d = t.devices.entry(dev).or_default();
            d.peak = Some(d.peak.unwrap_or(0).max(bytes));
        }
        for (stack, (objects, bytes)) in &t.alloc_by_stack {
            let e = heap.entry(stack.clone()).or_default();
            e.alloc_objects += objects;
            e.alloc_bytes += bytes;
        }
        let s = state.stats;
        ProcessSnapshot {
            pid: state.pid,
            comm: t.comm.clone(),
            container: t.container.clone(),
            exited: None,
            step,
            live,
            peak: by_name(&t.devices, |d| d.peak),
            suspects,
            allocations: s.mallocs + s.creates + s.pool_mallocs,
            frees: s.frees + s.releases + s.pool_frees,
            allocated_bytes: by_name(&t.devices, |d| d.allocated),
            heap,
        }
    }

    /// Drops the oldest exited processes beyond `--max-exited` and those past `--keep-exited`.
    fn prune(&self, procs: &mut BTreeMap<u32, ProcessSnapshot>) {
        let now = Instant::now();
        procs.retain(|_, p| p.exited.is_none_or(|t| now - t < self.keep_exited));
        let mut exited: Vec<(Instant, u32)> = procs
            .values()
            .filter_map(|p| p.exited.map(|t| (t, p.pid)))
            .collect();
        if exited.len() > self.max_exited {
            exited.sort();
            for (_, pid) in &exited[..exited.len() - self.max_exited] {
                procs.remove(pid);
            }
        }
    }
}

/// The counters of `pid`, made (and the process logged as picked up) at its first event.
fn tracked_entry<'a>(
    tracked: &'a mut HashMap<u32, Tracked, AddrHash>,
    held_names: &mut HashMap<u32, (String, Container), AddrHash>,
    shared: &Shared,
    pid: u32,
) -> &'a mut Tracked {
    tracked.entry(pid).or_insert_with(|| {
        // A process held at its first library open is named while it lives (a short job
        // may be gone by its first event).
        let (comm, container) = held_names
            .remove(&pid)
            .unwrap_or_else(|| (process_comm(pid), super::cgroup::of_process(pid)));
        shared
            .counters
            .processes_seen
            .fetch_add(1, Ordering::Relaxed);
        log::info(&format!(
            "picked up pid {pid} ({comm}): it called a probed library"
        ));
        Tracked {
            comm,
            // Read once (a process that moves between cgroups keeps the first: the labels of
            // its series must not change under it).
            container,
            devices: BTreeMap::new(),
            alloc_by_stack: HashMap::new(),
        }
    })
}

/// Per device name, as the snapshot shows them.
fn by_name(
    devices: &BTreeMap<DeviceKey, DeviceCounters>,
    value: impl Fn(&DeviceCounters) -> Option<u64>,
) -> BTreeMap<String, u64> {
    devices
        .iter()
        .filter_map(|(d, c)| Some((d.to_string(), value(c)?)))
        .collect()
}

fn add(a: &mut Amount, size: u64) {
    a.bytes += size;
    a.blocks += 1;
}

/// The size a call allocates, for sampling its stack (None: not an allocation).
fn allocated_size(call: &Call) -> Option<u64> {
    match call {
        Call::HalAlloc { size, .. } | Call::HalCreate { size, .. } => Some(*size),
        Call::RegionsRegister { regions, .. } => Some(regions.iter().map(|r| r.size).sum()),
        Call::PtaUsage(u) if u.size > 0 => Some(u.size),
        Call::CudaAlloc { size, .. } | Call::CudaCreate { size, .. } => Some(*size),
        Call::C10Usage(r) if r.size > 0 => Some(r.size as u64),
        Call::MsPoolAlloc { size, .. } => Some(*size),
        _ => None,
    }
}

impl Observer for AgentObserver {
    fn received(&mut self, pid: u32) {
        // Its name, while it lives (a short job may be gone by the time its events apply).
        // Calls come in runs from one process: one lookup per run.
        if self.last_received != Some(pid) {
            self.tracked(pid);
            self.last_received = Some(pid);
        }
    }

    fn wants_stack(&mut self, call: &CallEvent) -> bool {
        // BPF decided (`sampling.rs`): an allocation carries a stack sample only if sampled.
        allocated_size(&call.call).is_some()
    }

    fn applied(&mut self, state: &ProcessState, rows: &[Row]) {
        let sampler = self.sampler;
        let Self {
            tracked,
            held_names,
            shared,
            other,
            ..
        } = self;
        let t = tracked_entry(tracked, held_names, shared, state.pid);
        if let Some(snapshots) = &shared.memory_snapshots
            && rows.iter().any(SnapshotRecorder::wants)
        {
            let mut snapshots = snapshots.lock().unwrap_or_else(|e| e.into_inner());
            let s = snapshots
                .entry(state.pid)
                .or_insert_with(|| SnapshotRecorder::keeping(true, snapshot::AGENT_TRACE_ENTRIES));
            rows.iter().for_each(|r| s.row(r));
        }
        for r in rows {
            let is_malloc = match r.event {
                "MALLOC" => true,
                "FREE" => false,
                _ => continue,
            };
            // A number on the row: the agent's rows carry no Attr text (`row_attrs`).
            let Some(size) = r.size else {
                continue;
            };
            let d = t.devices.entry(r.device).or_default();
            if !is_malloc {
                d.live = d.live.saturating_sub(size);
                continue;
            }
            d.live += size;
            d.peak = Some(d.peak.unwrap_or(0).max(d.live));
            d.allocated = Some(d.allocated.unwrap_or(0) + size);
            let sampled = match &r.c_stack {
                Some(s) if &**s == crate::events::stacks::DROPPED_STACK => {
                    &shared.counters.dropped_stacks
                }
                Some(_) => &shared.counters.sampled_stacks,
                None => &shared.counters.unsampled_allocations,
            };
            sampled.fetch_add(1, Ordering::Relaxed);
            if let Some(stack) = &r.c_stack {
                let key = if t.alloc_by_stack.len() < MAX_STACKS_PER_PROCESS
                    || t.alloc_by_stack.contains_key(stack)
                {
                    stack.clone()
                } else {
                    other.clone()
                };
                let w = sampler.weight(size);
                let e = t.alloc_by_stack.entry(key).or_default();
                e.0 += w;
                e.1 += w * size as f64;
            }
        }
    }

    fn tick(&mut self, states: &mut dyn Iterator<Item = &ProcessState>, events: u64, lost: u64) {
        self.shared.events.store(events, Ordering::Relaxed);
        self.shared.lost.store(lost, Ordering::Relaxed);
        if self.last_snapshot.elapsed() < self.snapshot_every {
            return;
        }
        self.last_snapshot = Instant::now();
        let snaps: Vec<ProcessSnapshot> = states.map(|s| self.snapshot(s)).collect();
        let mut procs = self
            .shared
            .processes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for s in snaps {
            procs.insert(s.pid, s);
        }
        self.prune(&mut procs);
    }

    fn finished(&mut self, state: &ProcessState) {
        let mut s = self.snapshot(state);
        s.exited = Some(Instant::now());
        self.tracked.remove(&state.pid);
        if let Some(snapshots) = &self.shared.memory_snapshots {
            let mut snapshots = snapshots.lock().unwrap_or_else(|e| e.into_inner());
            snapshots.remove(&state.pid);
        }
        if self.last_received == Some(state.pid) {
            self.last_received = None;
        }
        let live: u64 = s.live.values().map(|a| a.bytes).sum();
        let blocks: u64 = s.live.values().map(|a| a.blocks).sum();
        let suspects: u64 = s.suspects.values().map(|a| a.blocks).sum();
        log::info(&format!(
            "lost pid {} ({}): exited with {live} bytes live in {blocks} block(s), {suspects} \
             leak suspect(s); its final state stays in /metrics for {} s",
            s.pid,
            s.comm,
            self.keep_exited.as_secs()
        ));
        let mut procs = self
            .shared
            .processes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        procs.insert(s.pid, s);
        self.prune(&mut procs);
    }

    fn held(&mut self, pid: u32, held_ns: u64, by_watchdog: bool) {
        if !self.tracked.contains_key(&pid) {
            // Processes held but never picked up (no call) leave names behind: a bound.
            if self.held_names.len() >= 4096 {
                self.held_names.clear();
            }
            self.held_names
                .insert(pid, (process_comm(pid), super::cgroup::of_process(pid)));
        }
        let c = &self.shared.counters;
        c.holds.fetch_add(1, Ordering::Relaxed);
        c.holds_by_watchdog
            .fetch_add(by_watchdog as u64, Ordering::Relaxed);
        c.hold_ns.fetch_add(held_ns, Ordering::Relaxed);
    }
}

/// `/proc/PID/comm` (the kernel's 15-character name), or `?` once the process is gone.
pub fn process_comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_else(|_| "?".to_string())
}
