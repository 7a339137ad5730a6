//! Per-process memory state: live blocks, running `used` totals, steps and the current device
//! of each thread. Turns decoded calls into output rows and keeps what the analyses need.

use std::collections::HashMap;

use crate::events::atb::AtbOut;
use crate::events::labels::{self, Labels, ThreadLabels};

use crate::{
    analysis::{
        decompose::Decompose,
        inefficient::{self, InefficientAnalyzer, MemEvent},
        steps::{Gaps, LiveBlock, StepLeaks},
    },
    cli::{DeviceFilter, EventSet},
    events::decode::{Call, CallEvent},
    events::hal::{self, AllocFlag, DEVICE_CPU, MemType, PageType},
    events::pools::{PoolKind, Pools, RegionChange},
    output::{DeviceKey, Row, csv::quote_text},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockKind {
    /// `halMemAlloc` of device memory.
    Device,
    /// `halMemAlloc` of pinned host memory (reported on device `cpu`).
    PinnedHost,
    /// `halMemCreate` (physical memory handle).
    Handle,
    /// A region of a framework pool (mstx memory API).
    Pool(PoolKind),
}

impl BlockKind {
    pub fn event_type(self) -> &'static str {
        match self {
            BlockKind::PinnedHost => "HOST",
            BlockKind::Pool(p) => p.event_type(),
            _ => "HAL",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub allocation_id: u64,
    pub addr: u64,
    pub size: u64,
    pub device: u32,
    pub kind: BlockKind,
    pub tid: u32,
    pub ts_ns: u64,
    /// The mstx step the block was allocated in (0 before the first `"step start"` range).
    pub step: u32,
    pub module_id: u32,
    pub page_type: PageType,
    /// The C stack of the allocation (`--call-stack=c`), for the OOM report.
    pub stack: Option<std::sync::Arc<str>>,
    /// Kernel launches the process had made before this allocation.
    pub kernel_index: u64,
    /// Decompose labels of levels 1-7 (`labels.rs`); pool blocks only, with `decompose`.
    pub labels: Option<Box<Labels>>,
}

impl Block {
    /// The decompose label of the block (spec §2.7): `CANN@<module>` for driver memory (by the
    /// module of the allocation flag, or of `drv_mem_prop`), the pool for pool regions.
    pub fn owner(&self) -> String {
        let framework = match self.kind {
            BlockKind::Pool(PoolKind::PtaCaching) => "PTA",
            BlockKind::Pool(PoolKind::PtaWorkspace) => "PTA_WORKSPACE",
            BlockKind::Pool(PoolKind::MindSpore) => "MINDSPORE",
            BlockKind::Pool(PoolKind::Atb) => "ATB",
            _ => return format!("CANN@{}", module_label(self.module_id)),
        };
        labels::compose(framework, self.labels.as_deref())
    }
}

/// Counts kept per process for the summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessStats {
    pub mallocs: u64,
    pub frees: u64,
    pub creates: u64,
    pub releases: u64,
    pub marks: u64,
    pub ranges: u64,
    /// Successful frees/releases of addresses never seen allocated (allocated before attach,
    /// or during a lost event).
    pub unmatched_frees: u64,
    pub failed_allocs: u64,
    pub failed_frees: u64,
    /// An allocation returned an address that was still live: the old block is closed.
    pub double_mallocs: u64,
    /// Events dropped by `--device`.
    pub filtered: u64,
    pub pool_mallocs: u64,
    pub pool_frees: u64,
    /// Pool regions freed that were never seen registered.
    pub pool_unmatched: u64,
    /// Allocations that failed for lack of device memory (`DRV_ERROR_OUT_OF_MEMORY`).
    pub ooms: u64,
    pub ops: u64,
    pub accesses: u64,
    pub launches: u64,
    /// ATen and ATB accesses to an address inside no known pool block.
    pub unmatched_accesses: u64,
    /// ATB kernels (`SaveLaunchParam` before-calls).
    pub atb_kernels: u64,
    /// `rt*` launches made inside an `aclrt*` launch (counted once, as the aclrt* one).
    pub nested_launches: u64,
}

/// Hasher for address-keyed maps: one multiply instead of SipHash (the keys come from the
/// traced process, not from an adversary; the user-space throughput bench measures it).
type AddrHash = std::hash::BuildHasherDefault<AddrHasher>;

#[derive(Default)]
pub struct AddrHasher(u64);

impl std::hash::Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ *b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }
    fn write_u64(&mut self, v: u64) {
        // Fold the high bits down so hashbrown's top-7-bit tags and low-bit buckets both vary.
        let h = (self.0 ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = h ^ (h >> 29);
    }
}

/// State of one traced process.
#[derive(Debug, Default)]
pub struct ProcessState {
    pub pid: u32,
    live: HashMap<u64, Block, AddrHash>,
    live_handles: HashMap<u64, Block, AddrHash>,
    /// Keyed by device id: looked up for every MALLOC/FREE row, so not SipHash.
    used: HashMap<u32, u64, AddrHash>,
    next_allocation_id: u64,
    step: u32,
    step_range: Option<u64>,
    thread_device: HashMap<u32, u32, AddrHash>,
    /// Blocks left out by `--device`, so their frees are left out too.
    filtered_addrs: std::collections::HashSet<u64>,
    pools: Pools,
    pool_blocks: HashMap<(PoolKind, u64), Block>,
    step_leaks: StepLeaks,
    gaps: Gaps,
    /// Findings of the step analyses, for the caller to log.
    pub messages: Vec<String>,
    pub decompose: Decompose,
    pub inefficient: InefficientAnalyzer,
    /// The same for the ATB pool, fed by ATB operators (msMemScope keeps them apart).
    pub inefficient_atb: InefficientAnalyzer,
    /// Start address -> key of the live PTA caching blocks (accesses find theirs by
    /// containment).
    pta_by_addr: std::collections::BTreeMap<u64, u64>,
    /// The allocation id of the last PTA block (caching or workspace) made at each address.
    pta_last_at: HashMap<u64, u64>,
    /// Start address -> key of the live ATB pool blocks.
    atb_by_addr: std::collections::BTreeMap<u64, u64>,
    /// ATB calls being put back together from their probes' events.
    atb: crate::events::atb::AtbAssembler,
    /// Decompose labels pushed by each thread (`memscope-label-*` marks).
    thread_labels: HashMap<u32, ThreadLabels>,
    /// The operator an ATen access belongs to.
    current_op: Option<String>,
    /// Kernel launches so far (a block's `kernel_index` is this at its allocation).
    kernel_index: u64,
    /// Thread -> end of its latest `aclrt*` launch call (realtime ns).
    aclrt_launch_until: HashMap<u32, u64>,
    /// Stream pointer -> (stream number, next task number).
    streams: HashMap<u64, (u32, u64)>,
    /// The stack of the call being applied (set by `apply`).
    current_stack: Option<std::sync::Arc<str>>,
    /// Its Python stack (set by `set_python_stack` before `apply`).
    current_py_stack: Option<std::sync::Arc<str>>,
    last_oom_detail_ns: Option<u64>,
    pub stats: ProcessStats,
    /// An empty vector with capacity, reused as `apply_call`'s row list by `apply_into`, so
    /// the hot path allocates no vector per event.
    spare_rows: Vec<Row>,
}

/// `--steps`: the mstx steps whose events are kept (empty: all events).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepFilter {
    steps: [u32; 5],
    len: usize,
}

impl StepFilter {
    pub fn new(steps: &[u32]) -> Self {
        let mut f = StepFilter::default();
        for s in steps.iter().take(5) {
            f.steps[f.len] = *s;
            f.len += 1;
        }
        f
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn keeps(&self, in_step: bool, step: u32) -> bool {
        self.is_empty() || (in_step && self.steps[..self.len].contains(&step))
    }
}

/// What the tracker needs from the command line.
#[derive(Clone, Copy, Debug)]
pub struct TrackOptions {
    pub dump: EventSet,
    pub devices: DeviceFilter,
    pub steps: StepFilter,
    /// Run the pool step analyses (leaks per step, gaps): `--analysis=leaks` without `--steps`.
    pub step_analyses: bool,
    /// `--analysis=oom[:K]`: on an out-of-memory failure, report the K most recent and the K
    /// largest live blocks.
    pub oom_top_k: Option<u32>,
    /// `--analysis=decompose`: owners in the MALLOC Attr and the per-owner breakdown.
    pub decompose: bool,
    /// `--analysis=inefficient`: classify pool blocks by operator boundaries and accesses.
    pub inefficient: bool,
    /// Write OP_LAUNCH rows (`--level` has op and `--events` has launch).
    pub write_op_launch: bool,
    /// Write KERNEL_LAUNCH rows (`--level` has kernel and `--events` has launch).
    pub write_kernel_launch: bool,
}

/// `DRV_ERROR_OUT_OF_MEMORY`.
pub const DRV_ERROR_OUT_OF_MEMORY: i32 = 6;
/// Detail dumps of one process are at least this far apart (msMemScope's throttle).
const OOM_DETAIL_INTERVAL_NS: u64 = 2_000_000_000;

impl ProcessState {
    pub fn new(pid: u32) -> Self {
        ProcessState {
            pid,
            ..Default::default()
        }
    }

    /// Blocks still live, in allocation order.
    pub fn live_blocks(&self) -> Vec<Block> {
        let mut v: Vec<Block> = self
            .live
            .values()
            .chain(self.live_handles.values())
            .cloned()
            .collect();
        v.sort_by_key(|b| b.allocation_id);
        v
    }

    /// Visits every live block: driver blocks, memory handles and pool regions (the node
    /// agent's snapshots; no copies).
    pub fn for_each_live_block(&self, mut f: impl FnMut(&Block)) {
        self.live
            .values()
            .chain(self.live_handles.values())
            .chain(self.pool_blocks.values())
            .for_each(&mut f);
    }

    /// The current mstx step (0 before the first `"step start"` range).
    pub fn step(&self) -> u32 {
        self.step
    }

    fn wants_device(&self, opts: &TrackOptions, device: u32) -> bool {
        if device == DEVICE_CPU {
            opts.devices.wants_cpu()
        } else {
            opts.devices.wants_npu(device)
        }
    }

    /// The Python stack (`--call-stack=python`) of the next call given to `apply`: its rows
    /// carry it.
    pub fn set_python_stack(&mut self, stack: Option<std::sync::Arc<str>>) {
        self.current_py_stack = stack;
    }

    /// Applies one call; returns the rows to write (possibly none).
    /// `stack` is the C stack of the call (`--call-stack=c`): its rows carry it, and so do the
    /// blocks it allocates.
    pub fn apply(
        &mut self,
        ev: &CallEvent,
        ts_ns: u64,
        opts: &TrackOptions,
        stack: Option<std::sync::Arc<str>>,
    ) -> Vec<Row> {
        let mut rows = Vec::new();
        self.apply_into(ev, ts_ns, opts, stack, &mut rows);
        rows
    }

    /// [`apply`](Self::apply), appending the rows to `out`: with an `out` that the caller
    /// drains and reuses, applying an event allocates no vector.
    pub fn apply_into(
        &mut self,
        ev: &CallEvent,
        ts_ns: u64,
        opts: &TrackOptions,
        stack: Option<std::sync::Arc<str>>,
        out: &mut Vec<Row>,
    ) {
        self.current_stack = stack;
        let kept_before = opts.steps.keeps(self.step_range.is_some(), self.step);
        let mut rows = self.apply_call(ev, ts_ns, opts);
        let kept_after = opts.steps.keeps(self.step_range.is_some(), self.step);
        // A step's own Range_start and Range_end rows belong to it.
        if !kept_before && !kept_after {
            rows.clear();
        }
        for r in &mut rows {
            // OOM detail rows carry the stacks of the blocks they list (set when built).
            if r.c_stack.is_none() && r.event != "OOM_DETAIL" {
                r.c_stack = self.current_stack.clone();
            }
            if r.py_stack.is_none() && r.event != "OOM_DETAIL" {
                r.py_stack = self.current_py_stack.clone();
            }
        }
        self.current_stack = None;
        self.current_py_stack = None;
        if out.is_empty() {
            // The usual case: hand over the vector itself, keep `out`'s allocation as spare.
            std::mem::swap(out, &mut rows);
        } else {
            out.append(&mut rows);
        }
        self.spare_rows = rows;
    }

    /// An allocation failed for lack of memory (spec §6.6): the trigger row, then, at most
    /// every 2 s, the K most recent and the K largest live blocks (the process's HAL blocks
    /// and the pools' blocks on that device).
    #[allow(clippy::too_many_arguments)]
    fn oom(
        &mut self,
        func: &str,
        size: u64,
        flag: u64,
        device: u32,
        tid: u32,
        ts_ns: u64,
        k: u32,
        rows: &mut Vec<Row>,
    ) {
        self.stats.ooms += 1;
        let base = Row {
            event: "OOM_DETAIL",
            event_type: "OOM_TRIGGER",
            name: "OOM_Trigger".into(),
            ts_ns,
            pid: self.pid,
            tid,
            device: DeviceKey::from_id(device),
            ptr: None,
            attr: format!("func:{func},req_size:{size},flag:{flag}"),
            c_stack: self.current_stack.clone(),
            py_stack: self.current_py_stack.clone(),
        };
        rows.push(base.clone());
        if self
            .last_oom_detail_ns
            .is_some_and(|last| ts_ns.saturating_sub(last) < OOM_DETAIL_INTERVAL_NS)
        {
            return;
        }
        self.last_oom_detail_ns = Some(ts_ns);
        let mut live: Vec<&Block> = self
            .live
            .values()
            .chain(self.live_handles.values())
            .chain(self.pool_blocks.values().filter(|b| b.device == device))
            .collect();
        let k = k as usize;
        let mut emit = |live: &[&Block], event_type: &'static str, name: &'static str| {
            for b in live.iter().take(k) {
                let pool = match b.kind {
                    BlockKind::Pool(PoolKind::PtaCaching) => "PTA",
                    BlockKind::Pool(PoolKind::PtaWorkspace) => "PTA_WORKSPACE",
                    BlockKind::Pool(PoolKind::Atb) => "ATB",
                    BlockKind::Pool(PoolKind::MindSpore) => "MINDSPORE",
                    _ => "HAL",
                };
                rows.push(Row {
                    event_type,
                    name: name.into(),
                    device: DeviceKey::from_id(b.device),
                    attr: format!(
                        "pool:{pool},ptr:0x{:016x},size:{},timestamp:{}",
                        b.addr, b.size, b.ts_ns
                    ),
                    c_stack: Some(b.stack.clone().unwrap_or_else(|| std::sync::Arc::from(""))),
                    ..base.clone()
                });
            }
        };
        live.sort_by(|a, b| {
            b.ts_ns
                .cmp(&a.ts_ns)
                .then(b.allocation_id.cmp(&a.allocation_id))
        });
        emit(&live, "OOM_RECENT_ALLOC", "OOM_RecentAlloc");
        live.sort_by(|a, b| {
            b.size
                .cmp(&a.size)
                .then(b.allocation_id.cmp(&a.allocation_id))
        });
        emit(&live, "OOM_TOP_ALLOC", "OOM_TopAlloc");
    }

    fn apply_call(&mut self, ev: &CallEvent, ts_ns: u64, opts: &TrackOptions) -> Vec<Row> {
        let mut rows = std::mem::take(&mut self.spare_rows);
        let row =
            |event: &'static str, event_type: &'static str, name: String, device: DeviceKey| Row {
                event,
                event_type,
                name: name.into(),
                ts_ns,
                pid: ev.pid,
                tid: ev.tid,
                device,
                ptr: None,
                attr: String::new(),
                c_stack: None,
                py_stack: None,
            };
        match &ev.call {
            Call::HalAlloc {
                size,
                flag,
                ret,
                addr,
            } => {
                let f = AllocFlag::decode(*flag);
                let device = f.reported_device();
                let Some(addr) = addr.filter(|_| *ret == 0) else {
                    self.stats.failed_allocs += 1;
                    if *ret == DRV_ERROR_OUT_OF_MEMORY
                        && let Some(k) = opts.oom_top_k
                    {
                        self.oom(
                            "halMemAlloc",
                            *size,
                            *flag,
                            device,
                            ev.tid,
                            ts_ns,
                            k,
                            &mut rows,
                        );
                    }
                    return rows;
                };
                if !self.wants_device(opts, device) {
                    self.stats.filtered += 1;
                    // Its free is filtered too, not reported as a free of an unknown address.
                    self.filtered_addrs.insert(addr);
                    return rows;
                }
                let kind = if f.mem_type == MemType::Host {
                    BlockKind::PinnedHost
                } else {
                    BlockKind::Device
                };
                self.stats.mallocs += 1;
                let block = self.new_block(
                    addr,
                    *size,
                    device,
                    kind,
                    ev.tid,
                    ts_ns,
                    f.module_id as u32,
                    f.page_type,
                );
                self.insert_block(block, false, opts, ts_ns, &mut rows);
            }
            Call::HalCreate {
                size,
                prop,
                ret,
                handle,
                flag,
            } => {
                let (device, module, page) = match prop {
                    Some(p) => (p.devid, p.module_id, PageType::from_prop(p.pg_type)),
                    None => (0, u32::MAX, PageType::Normal),
                };
                let Some(handle) = handle.filter(|_| *ret == 0) else {
                    self.stats.failed_allocs += 1;
                    if *ret == DRV_ERROR_OUT_OF_MEMORY
                        && let Some(k) = opts.oom_top_k
                    {
                        self.oom(
                            "halMemCreate",
                            *size,
                            *flag,
                            device,
                            ev.tid,
                            ts_ns,
                            k,
                            &mut rows,
                        );
                    }
                    return rows;
                };
                if !self.wants_device(opts, device) {
                    self.stats.filtered += 1;
                    self.filtered_addrs.insert(handle);
                    return rows;
                }
                self.stats.creates += 1;
                let block = self.new_block(
                    handle,
                    *size,
                    device,
                    BlockKind::Handle,
                    ev.tid,
                    ts_ns,
                    module,
                    page,
                );
                self.insert_block(block, true, opts, ts_ns, &mut rows);
            }
            Call::HalFree { addr, ret } => {
                if *ret != 0 {
                    self.stats.failed_frees += 1;
                    return rows;
                }
                match self.live.remove(addr) {
                    Some(block) => {
                        self.stats.frees += 1;
                        self.free_row(&block, ev.tid, ts_ns, opts, &mut rows);
                    }
                    None => self.note_unmatched(*addr, opts),
                }
            }
            Call::HalRelease { handle, ret } => {
                if *ret != 0 {
                    self.stats.failed_frees += 1;
                    return rows;
                }
                match self.live_handles.remove(handle) {
                    Some(block) => {
                        self.stats.releases += 1;
                        self.free_row(&block, ev.tid, ts_ns, opts, &mut rows);
                    }
                    None => self.note_unmatched(*handle, opts),
                }
            }
            Call::AclInit { .. } => {
                rows.push(row(
                    "SYSTEM",
                    "ACL_INIT",
                    "N/A".into(),
                    DeviceKey::NotApplicable,
                ));
            }
            Call::AclFinalize { .. } => {
                rows.push(row(
                    "SYSTEM",
                    "ACL_FINI",
                    "N/A".into(),
                    DeviceKey::NotApplicable,
                ));
            }
            Call::SetDevice { device, ret } => {
                if *ret == 0 && *device >= 0 {
                    self.thread_device.insert(ev.tid, *device as u32);
                }
            }
            Call::Mark { text } if text.starts_with("memscope-aten-") => {
                self.aten_mark(text, ev.tid, ts_ns, opts, &mut rows);
            }
            Call::Mark { text } if text.starts_with("memscope-label-") => {
                self.label_mark(text, ev.tid, opts);
            }
            // Marks for the NPU sanitizer are never MSTX rows (msMemScope routes them away).
            Call::Mark { text } if text.starts_with("sanitizer-op:") => {}
            Call::Mark { text } => {
                self.stats.marks += 1;
                if let Some(device) = self.mstx_device(ev.tid, opts) {
                    rows.push(row(
                        "MSTX",
                        "Mark",
                        quote_text(&guard_formula(text)),
                        device,
                    ));
                }
            }
            Call::RangeStart { text, id } => {
                self.stats.ranges += 1;
                // Steps advance even when `--device` keeps the row out of the output.
                if text == "step start" {
                    self.step += 1;
                    self.step_range = Some(*id);
                    if opts.step_analyses {
                        self.gaps.on_step_start(self.step);
                    }
                }
                if let Some(device) = self.mstx_device(ev.tid, opts) {
                    let name = quote_text(&guard_formula(text));
                    rows.push(row("MSTX", "Range_start", name, device));
                }
            }
            Call::RangeEnd { id } => {
                if let Some(device) = self.mstx_device(ev.tid, opts) {
                    let name = quote_text(&format!("Range end from id {id}"));
                    rows.push(row("MSTX", "Range_end", name, device));
                }
                if self.step_range == Some(*id) {
                    self.step_range = None;
                    if opts.step_analyses {
                        self.step_ended();
                    }
                    if opts.decompose {
                        self.decompose.on_step_end(self.step);
                    }
                }
            }
            Call::DomainCreate { name, handle } => self.pools.domain_created(name, *handle),
            Call::HeapRegister {
                domain,
                heap,
                range,
            } => {
                if let Some(range) = range {
                    self.pools.heap_registered(*domain, *heap, *range);
                }
            }
            Call::HeapUnregister { domain, heap } => self.pools.heap_unregistered(*domain, *heap),
            Call::RegionsRegister {
                domain, regions, ..
            } => {
                for change in self.pools.regions_registered(*domain, regions) {
                    self.pool_malloc(change, ev.tid, ts_ns, opts, &mut rows);
                }
            }
            Call::Exiting { .. } => {}
            Call::OpLaunch {
                op,
                workspace,
                workspace_size,
                ret,
                duration_ns,
            } => {
                self.stats.ops += 1;
                if opts.write_op_launch
                    && let Some(device) = self.mstx_device(ev.tid, opts)
                {
                    let name =
                        crate::events::aclnn::name(*op).unwrap_or_else(|| format!("aclnn#{op}"));
                    let mut attr =
                        format!("workspace_addr:0x{workspace:x},workspace_size:{workspace_size}");
                    if let Some(id) = self.workspace_block(*workspace) {
                        attr.push_str(&format!(",workspace_allocation_id:{id}"));
                    }
                    let (pid, tid) = (self.pid, ev.tid);
                    let op_row = |event_type, ts_ns, attr: String| Row {
                        event: "OP_LAUNCH",
                        event_type,
                        name: name.clone().into(),
                        ts_ns,
                        pid,
                        tid,
                        device,
                        ptr: None,
                        attr,
                        c_stack: None,
                        py_stack: None,
                    };
                    rows.push(op_row("ACLNN_START", ts_ns, attr));
                    rows.push(op_row(
                        "ACLNN_END",
                        ts_ns.saturating_add(*duration_ns),
                        format!("ret:{ret}"),
                    ));
                }
            }
            Call::PtaUsage(u) => {
                use crate::trace::torch_npu::{Component, DataType};
                let change = RegionChange {
                    pool: match u.component {
                        Component::CachingAllocator => PoolKind::PtaCaching,
                        Component::WorkspaceAllocator => PoolKind::PtaWorkspace,
                    },
                    device: u.device_index.max(0) as u32,
                    addr: u.ptr,
                    size: u.size,
                    allocated: u.total_allocated.max(0) as u64,
                    reserved: u.total_reserved.max(0) as u64,
                };
                match u.data_type {
                    DataType::Malloc => self.pool_malloc(change, ev.tid, ts_ns, opts, &mut rows),
                    DataType::Free => self.pool_free(change, ev.tid, ts_ns, opts, &mut rows),
                    // The same block's FREE follows, with the totals after the whole free.
                    DataType::BlockFree => {}
                }
            }
            Call::KernelLaunch {
                api,
                kernel,
                tiling_key,
                stream,
                name,
                duration_ns,
            } => {
                if let Some(d) = duration_ns {
                    self.aclrt_launch_until
                        .insert(ev.tid, ts_ns.saturating_add(*d));
                } else if self
                    .aclrt_launch_until
                    .get(&ev.tid)
                    .is_some_and(|until| ts_ns <= *until)
                {
                    // The runtime launch inside an aclrt* launch on this thread.
                    self.stats.nested_launches += 1;
                    return rows;
                }
                self.kernel_index += 1;
                self.stats.launches += 1;
                let next = self.streams.len() as u32;
                let entry = self.streams.entry(*stream).or_insert((next, 0));
                let (stream_id, task_id) = (entry.0, entry.1);
                entry.1 += 1;
                if opts.write_kernel_launch
                    && let Some(device) = self.mstx_device(ev.tid, opts)
                {
                    let name = name
                        .clone()
                        .unwrap_or_else(|| kernel_label(*api, *kernel, *tiling_key));
                    let mut r = row("KERNEL_LAUNCH", "KERNEL_LAUNCH", name, device);
                    r.attr = format!("streamId:{stream_id},taskId:{task_id}");
                    rows.push(r);
                }
            }
            Call::Atb {
                object,
                pack,
                event,
            } => {
                let outs = self
                    .atb
                    .on_event(ev.tid, *object, *pack, event.clone(), ts_ns);
                self.atb_rows(outs, ev.tid, opts, &mut rows);
            }
            Call::RegionsUnregister { domain, refs, .. } => {
                let before = self.pools.unmatched;
                for change in self.pools.regions_unregistered(*domain, refs) {
                    self.pool_free(change, ev.tid, ts_ns, opts, &mut rows);
                }
                self.stats.pool_unmatched += self.pools.unmatched - before;
            }
        }
        rows
    }

    fn pool_malloc(
        &mut self,
        c: RegionChange,
        tid: u32,
        ts_ns: u64,
        opts: &TrackOptions,
        rows: &mut Vec<Row>,
    ) {
        if !self.wants_device(opts, c.device) {
            self.stats.filtered += 1;
            return;
        }
        if opts.step_analyses {
            self.gaps.on_update(c.pool, c.device, c.allocated);
        }
        self.stats.pool_mallocs += 1;
        let mut block = self.new_block(
            c.addr,
            c.size,
            c.device,
            BlockKind::Pool(c.pool),
            tid,
            ts_ns,
            u32::MAX,
            PageType::Normal,
        );
        if opts.decompose {
            block.labels = self.thread_labels.get(&tid).and_then(|t| t.snapshot());
        }
        if c.pool == PoolKind::Atb {
            self.atb_by_addr.insert(c.addr, c.addr);
            if opts.inefficient {
                self.inefficient_atb
                    .event(block.allocation_id, MemEvent::Malloc);
            }
        }
        if matches!(c.pool, PoolKind::PtaCaching | PoolKind::PtaWorkspace) {
            self.pta_last_at.insert(c.addr, block.allocation_id);
        }
        if c.pool == PoolKind::PtaCaching {
            self.pta_by_addr.insert(c.addr, c.addr);
            if opts.inefficient {
                self.inefficient
                    .event(block.allocation_id, MemEvent::Malloc);
            }
        }
        if let Some(old) = self.pool_blocks.insert((c.pool, c.addr), block.clone()) {
            // Registered twice without an unregister in between: close the old one.
            self.stats.double_mallocs += 1;
            if opts.dump.free {
                rows.push(self.pool_row("FREE", &old, old.tid, ts_ns, c));
            }
            if opts.decompose {
                self.decompose.on_free(&old.owner(), old.size);
            }
        }
        if opts.decompose {
            self.decompose.on_alloc(&block.owner(), block.size);
        }
        if opts.dump.alloc {
            let mut row = self.pool_row("MALLOC", &block, tid, ts_ns, c);
            if opts.decompose {
                row.attr.push_str(",owner:");
                row.attr.push_str(&block.owner());
            }
            rows.push(row);
        }
    }

    fn pool_free(
        &mut self,
        c: RegionChange,
        tid: u32,
        ts_ns: u64,
        opts: &TrackOptions,
        rows: &mut Vec<Row>,
    ) {
        if opts.step_analyses && self.wants_device(opts, c.device) {
            self.gaps.on_update(c.pool, c.device, c.allocated);
        }
        let Some(block) = self.pool_blocks.remove(&(c.pool, c.addr)) else {
            // Registered on a filtered device, or before tracing started.
            return;
        };
        self.stats.pool_frees += 1;
        if opts.decompose {
            self.decompose.on_free(&block.owner(), block.size);
        }
        let mut found = String::new();
        if c.pool == PoolKind::Atb {
            self.atb_by_addr.remove(&c.addr);
            if opts.inefficient {
                found = inefficient::attr_value(
                    self.inefficient_atb
                        .event(block.allocation_id, MemEvent::Free),
                );
            }
        }
        if c.pool == PoolKind::PtaCaching {
            self.pta_by_addr.remove(&c.addr);
            if opts.inefficient {
                found = inefficient::attr_value(
                    self.inefficient.event(block.allocation_id, MemEvent::Free),
                );
            }
        }
        if opts.dump.free {
            let mut row = self.pool_row("FREE", &block, tid, ts_ns, c);
            // The MALLOC row was written before the block's accesses were known: the
            // classification goes on its FREE row (and into the summary).
            if !found.is_empty() {
                row.attr.push_str(",inefficient_type:");
                row.attr.push_str(&found);
            }
            rows.push(row);
        }
    }

    /// The ATen operator protocol of msMemScope's Python collector (spec §1.7): begin and end
    /// marks become OP_LAUNCH rows, access marks ACCESS rows on the PTA block they touch.
    fn aten_mark(
        &mut self,
        text: &str,
        tid: u32,
        ts_ns: u64,
        opts: &TrackOptions,
        rows: &mut Vec<Row>,
    ) {
        let rest = &text["memscope-aten-".len()..];
        let field = |body: &str, key: &str| -> Option<String> {
            body.split(';')
                .find_map(|kv| {
                    kv.trim()
                        .strip_prefix(key)
                        .and_then(|v| v.strip_prefix('='))
                })
                .map(|v| v.trim_end_matches('}').to_string())
        };
        let pid = self.pid;
        let op_row = move |event_type: &'static str, name: String, device: DeviceKey| Row {
            event: "OP_LAUNCH",
            event_type,
            name: name.into(),
            ts_ns,
            pid,
            tid,
            device,
            ptr: None,
            attr: String::new(),
            c_stack: None,
            py_stack: None,
        };
        if let Some(body) = rest.strip_prefix("b:") {
            let name = field(body, "name").unwrap_or_default();
            self.stats.ops += 1;
            if opts.inefficient {
                self.inefficient.op_start();
            }
            self.current_op = Some(name.clone());
            if opts.write_op_launch
                && let Some(device) = self.mstx_device(tid, opts)
            {
                rows.push(op_row("ATEN_START", name, device));
            }
        } else if let Some(body) = rest.strip_prefix("e:") {
            let name = field(body, "name").unwrap_or_default();
            if opts.inefficient {
                self.inefficient.op_end();
            }
            self.current_op = None;
            if opts.write_op_launch
                && let Some(device) = self.mstx_device(tid, opts)
            {
                rows.push(op_row("ATEN_END", name, device));
            }
        } else if let Some(body) = rest.strip_prefix("ac:") {
            let Some(ptr) = field(body, "ptr")
                .and_then(|p| parse_int(&p))
                .filter(|p| *p != 0)
            else {
                return;
            };
            let flag = |k| field(body, k).as_deref() == Some("True");
            let kind = match (flag("is_write"), flag("is_read")) {
                (false, false) => "UNKNOWN",
                (true, _) => "WRITE",
                _ => "READ",
            };
            let name = field(body, "name")
                .or_else(|| self.current_op.clone())
                .unwrap_or_default();
            let tensor_size = field(body, "tensor_size")
                .and_then(|s| parse_int(&s))
                .unwrap_or(1);
            self.stats.accesses += 1;
            // The live PTA block that contains the accessed range.
            let block = self
                .pta_by_addr
                .range(..=ptr)
                .next_back()
                .and_then(|(_, key)| self.pool_blocks.get(&(PoolKind::PtaCaching, *key)))
                .filter(|b| ptr + tensor_size.max(1) <= b.addr + b.size)
                .cloned();
            let Some(block) = block else {
                self.stats.unmatched_accesses += 1;
                return;
            };
            if opts.inefficient {
                self.inefficient
                    .event(block.allocation_id, MemEvent::Access);
            }
            self.relabel(
                (PoolKind::PtaCaching, block.addr),
                labels::DETAIL_2,
                "ops",
                true,
                opts,
            );
            let device = match field(body, "device")
                .and_then(|d| d.strip_prefix("npu:").and_then(|n| n.parse().ok()))
            {
                Some(d) => DeviceKey::Npu(d),
                None => DeviceKey::from_id(block.device),
            };
            if !opts.dump.access || !self.wants_device(opts, block.device) {
                return;
            }
            let mut attr = format!(
                "allocation_id:{},addr:0x{:016x},size:{},type:PTA",
                block.allocation_id, block.addr, block.size
            );
            for key in ["dtype", "shape"] {
                if let Some(v) = field(body, key) {
                    attr.push_str(&format!(",{key}:{v}"));
                }
            }
            rows.push(Row {
                event: "ACCESS",
                event_type: kind,
                name: name.into(),
                ts_ns,
                pid: self.pid,
                tid,
                device,
                ptr: Some(ptr),
                attr,
                c_stack: None,
                py_stack: None,
            });
        }
    }

    /// A `memscope-label-*` mark (labels.rs). Bad marks are reported, never rows.
    fn label_mark(&mut self, text: &str, tid: u32, opts: &TrackOptions) {
        if !opts.decompose {
            return;
        }
        match labels::parse_mark(text) {
            Ok(labels::LabelMark::Push { level, label }) => {
                if let Err(e) = self
                    .thread_labels
                    .entry(tid)
                    .or_default()
                    .push(level, &label)
                {
                    self.messages
                        .push(format!("pid {} tid {tid}: {e}", self.pid));
                }
            }
            Ok(labels::LabelMark::Pop { level, label }) => {
                if let Some(t) = self.thread_labels.get_mut(&tid) {
                    t.pop(level, &label);
                }
            }
            Ok(labels::LabelMark::Addr { ptr, level, label }) => {
                let key = self
                    .pta_by_addr
                    .range(..=ptr)
                    .next_back()
                    .map(|(_, k)| (PoolKind::PtaCaching, *k))
                    .filter(|k| {
                        self.pool_blocks
                            .get(k)
                            .is_some_and(|b| ptr < b.addr + b.size)
                    });
                match key {
                    Some(key) => self.relabel(key, level, &label, false, opts),
                    None => self.messages.push(format!(
                        "pid {}: {text:?}: no live PTA block holds 0x{ptr:x}",
                        self.pid
                    )),
                }
            }
            Err(e) => self
                .messages
                .push(format!("pid {}: ignored {text:?}: {e}", self.pid)),
        }
    }

    /// Sets one label level of a live pool block and moves its bytes to the new owner.
    /// `weak`: only when that level is empty (the `ops` tag of accesses).
    fn relabel(
        &mut self,
        key: (PoolKind, u64),
        level: usize,
        label: &str,
        weak: bool,
        opts: &TrackOptions,
    ) {
        if !opts.decompose {
            return;
        }
        let Some(b) = self.pool_blocks.get_mut(&key) else {
            return;
        };
        let slot = &b.labels.as_ref().and_then(|l| l[level - 1].clone());
        if slot.as_deref() == Some(label) || (weak && slot.is_some()) {
            return;
        }
        let old = b.owner();
        b.labels.get_or_insert_with(Default::default)[level - 1] = Some(label.into());
        let new = b.owner();
        self.decompose.on_free(&old, b.size);
        self.decompose.on_alloc(&new, b.size);
    }

    /// Rows for assembled ATB events: OP_LAUNCH ATB_START/ATB_END (`--level` op), KERNEL_LAUNCH
    /// KERNEL_START/KERNEL_END (`--level` kernel) and ACCESS rows on the ATB pool block that
    /// holds each tensor (spec §1.8, §3.2).
    fn atb_rows(&mut self, outs: Vec<AtbOut>, tid: u32, opts: &TrackOptions, rows: &mut Vec<Row>) {
        let pid = self.pid;
        let row = |event, event_type, name: String, ts_ns, device, attr| Row {
            event,
            event_type,
            name: name.into(),
            ts_ns,
            pid,
            tid,
            device,
            ptr: None,
            attr,
            c_stack: None,
            py_stack: None,
        };
        for o in outs {
            let start = matches!(o, AtbOut::OpStart { .. });
            match o {
                AtbOut::OpStart {
                    name,
                    path,
                    workspace,
                    workspace_size,
                    ts_ns,
                }
                | AtbOut::OpEnd {
                    name,
                    path,
                    workspace,
                    workspace_size,
                    ts_ns,
                } => {
                    if start {
                        self.stats.ops += 1;
                    }
                    if opts.inefficient {
                        if start {
                            self.inefficient_atb.op_start();
                        } else {
                            self.inefficient_atb.op_end();
                        }
                    }
                    if opts.write_op_launch
                        && let Some(device) = self.mstx_device(tid, opts)
                    {
                        let attr = format!(
                            "path:{path},workspace_ptr:0x{workspace:x},workspace_size:{workspace_size}"
                        );
                        let ty = if start { "ATB_START" } else { "ATB_END" };
                        rows.push(row("OP_LAUNCH", ty, name, ts_ns, device, attr));
                    }
                }
                AtbOut::Kernel {
                    name,
                    path,
                    end,
                    ts_ns,
                } => {
                    if !end {
                        self.stats.atb_kernels += 1;
                    }
                    if opts.write_kernel_launch
                        && let Some(device) = self.mstx_device(tid, opts)
                    {
                        let ty = if end { "KERNEL_END" } else { "KERNEL_START" };
                        let attr = format!("path:{path}");
                        rows.push(row("KERNEL_LAUNCH", ty, name, ts_ns, device, attr));
                    }
                }
                AtbOut::Access {
                    owner,
                    tensor,
                    write,
                    ts_ns,
                } => {
                    self.stats.accesses += 1;
                    let ptr = tensor.addr;
                    let block = self
                        .atb_by_addr
                        .range(..=ptr)
                        .next_back()
                        .and_then(|(_, key)| self.pool_blocks.get(&(PoolKind::Atb, *key)))
                        .filter(|b| ptr.saturating_add(tensor.size.max(1)) <= b.addr + b.size);
                    let Some(block) = block else {
                        self.stats.unmatched_accesses += 1;
                        continue;
                    };
                    if opts.inefficient {
                        self.inefficient_atb
                            .event(block.allocation_id, MemEvent::Access);
                    }
                    if !opts.dump.access || !self.wants_device(opts, block.device) {
                        continue;
                    }
                    let attr = format!(
                        "allocation_id:{},addr:0x{:016x},size:{},type:ATB,{}",
                        block.allocation_id,
                        block.addr,
                        block.size,
                        tensor.attr()
                    );
                    let ty = if write { "WRITE" } else { "UNKNOWN" };
                    let mut r = row(
                        "ACCESS",
                        ty,
                        owner,
                        ts_ns,
                        DeviceKey::from_id(block.device),
                        attr,
                    );
                    r.ptr = Some(ptr);
                    rows.push(r);
                }
            }
        }
    }

    /// End of the process: ATB operators that never returned still get their rows.
    pub fn finish_atb(&mut self, opts: &TrackOptions) -> Vec<Row> {
        let mut rows = Vec::new();
        for (tid, outs) in self.atb.finish() {
            self.atb_rows(outs, tid, opts, &mut rows);
        }
        rows
    }

    /// Blocks the inefficient analysis flagged: (allocation id, addr, size, types).
    pub fn inefficient_blocks(&self) -> Vec<(u64, String)> {
        let mut v: Vec<(u64, String)> = self
            .inefficient
            .flagged()
            .chain(self.inefficient_atb.flagged())
            .map(|(id, f)| (id, inefficient::attr_value(f)))
            .collect();
        v.sort();
        v
    }

    fn pool_row(
        &self,
        event: &'static str,
        b: &Block,
        tid: u32,
        ts_ns: u64,
        c: RegionChange,
    ) -> Row {
        Row {
            event,
            event_type: b.kind.event_type(),
            name: "N/A".into(),
            ts_ns,
            pid: self.pid,
            tid,
            device: DeviceKey::from_id(b.device),
            ptr: Some(b.addr),
            attr: format!(
                "allocation_id:{},addr:0x{:016x},size:{},used:{},total:{}",
                b.allocation_id, b.addr, b.size, c.allocated, c.reserved
            ),
            c_stack: None,
            py_stack: None,
        }
    }

    /// The allocation id of the PTA block an operator's workspace lies in: the last one
    /// allocated at that address (the framework may hand the block back to its pool before a
    /// queued operator runs: stream order keeps that safe), else a live block holding it.
    fn workspace_block(&self, addr: u64) -> Option<u64> {
        if addr == 0 {
            return None;
        }
        self.pta_last_at.get(&addr).copied().or_else(|| {
            let (_, start) = self.pta_by_addr.range(..=addr).next_back()?;
            let b = self.pool_blocks.get(&(PoolKind::PtaCaching, *start))?;
            (addr < b.addr + b.size).then_some(b.allocation_id)
        })
    }

    /// End of an mstx step: pool blocks that outlived it, and the step's allocation swing.
    fn step_ended(&mut self) {
        let live: Vec<LiveBlock> = self
            .pool_blocks
            .values()
            .filter_map(|b| match b.kind {
                BlockKind::Pool(pool) => Some(LiveBlock {
                    pool,
                    device: b.device,
                    addr: b.addr,
                    size: b.size,
                    alloc_step: b.step,
                    kernel_index: b.kernel_index,
                }),
                _ => None,
            })
            .collect();
        let step = self.step;
        self.messages
            .extend(self.step_leaks.on_step_end(step, &live));
        self.messages.extend(self.gaps.on_step_end(step));
    }

    /// The pool analyses' exit report (empty when there is nothing to say).
    pub fn pool_report(&self) -> String {
        let mut s = self.step_leaks.report();
        s.push_str(&self.gaps.report());
        s
    }

    /// Pool regions still live (not part of the HAL leak report).
    pub fn live_pool_blocks(&self) -> usize {
        self.pool_blocks.len()
    }

    /// The device an mstx row is written on: the thread's current device (aclrtSetDevice),
    /// or `None` when `--device` leaves that device out.
    fn mstx_device(&mut self, tid: u32, opts: &TrackOptions) -> Option<DeviceKey> {
        match self.thread_device.get(&tid) {
            Some(d) if !opts.devices.wants_npu(*d) => {
                self.stats.filtered += 1;
                None
            }
            Some(d) => Some(DeviceKey::Npu(*d)),
            None => Some(DeviceKey::NotApplicable),
        }
    }

    fn note_unmatched(&mut self, addr: u64, _opts: &TrackOptions) {
        if self.filtered_addrs.remove(&addr) {
            self.stats.filtered += 1;
        } else {
            self.stats.unmatched_frees += 1;
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn new_block(
        &mut self,
        addr: u64,
        size: u64,
        device: u32,
        kind: BlockKind,
        tid: u32,
        ts_ns: u64,
        module_id: u32,
        page_type: PageType,
    ) -> Block {
        self.next_allocation_id += 1;
        Block {
            allocation_id: self.next_allocation_id,
            addr,
            size,
            device,
            kind,
            tid,
            ts_ns,
            step: self.step,
            module_id,
            page_type,
            stack: self.current_stack.clone(),
            kernel_index: self.kernel_index,
            labels: None,
        }
    }

    fn insert_block(
        &mut self,
        block: Block,
        handle: bool,
        opts: &TrackOptions,
        ts_ns: u64,
        rows: &mut Vec<Row>,
    ) {
        let table = if handle {
            &mut self.live_handles
        } else {
            &mut self.live
        };
        if let Some(old) = table.remove(&block.addr) {
            // The driver handed out an address we still think is live: its free was missed.
            // Close the old block with a synthetic FREE so `used` stays right.
            self.stats.double_mallocs += 1;
            self.free_row(&old, old.tid, ts_ns, opts, rows);
        }
        *self.used.entry(block.device).or_default() += block.size;
        if opts.decompose {
            self.decompose.on_alloc(&block.owner(), block.size);
        }
        if opts.dump.alloc {
            let mut row = self.memory_row("MALLOC", &block, block.tid, ts_ns, true);
            if opts.decompose {
                add_owner(&mut row.attr, &block.owner());
            }
            rows.push(row);
        }
        let table = if handle {
            &mut self.live_handles
        } else {
            &mut self.live
        };
        table.insert(block.addr, block);
    }

    fn free_row(
        &mut self,
        block: &Block,
        tid: u32,
        ts_ns: u64,
        opts: &TrackOptions,
        rows: &mut Vec<Row>,
    ) {
        let used = self.used.entry(block.device).or_default();
        *used = used.saturating_sub(block.size);
        if opts.decompose {
            self.decompose.on_free(&block.owner(), block.size);
        }
        if opts.dump.free {
            rows.push(self.memory_row("FREE", block, tid, ts_ns, false));
        }
    }

    fn memory_row(
        &self,
        event: &'static str,
        b: &Block,
        tid: u32,
        ts_ns: u64,
        is_malloc: bool,
    ) -> Row {
        let used = self.used.get(&b.device).copied().unwrap_or(0);
        // Hot path (every MALLOC/FREE row): one allocation, no `format!` temporaries.
        use crate::output::csv::{push_hex16, push_u64};
        let mut attr = Vec::with_capacity(128);
        attr.extend_from_slice(b"allocation_id:");
        push_u64(&mut attr, b.allocation_id);
        attr.extend_from_slice(b",addr:");
        push_hex16(&mut attr, b.addr);
        attr.extend_from_slice(b",size:");
        push_u64(&mut attr, b.size);
        match b.kind {
            BlockKind::PinnedHost => {
                attr.extend_from_slice(b",pinned:true,used:");
                push_u64(&mut attr, used);
            }
            // Pool rows are built by `pool_row`; kept total for exhaustiveness.
            BlockKind::Pool(_) => {
                attr.extend_from_slice(b",used:");
                push_u64(&mut attr, used);
            }
            BlockKind::Device | BlockKind::Handle => {
                attr.extend_from_slice(b",used:");
                push_u64(&mut attr, used);
                if is_malloc {
                    attr.extend_from_slice(b",page_type:");
                    attr.extend_from_slice(b.page_type.as_str().as_bytes());
                    attr.extend_from_slice(if b.kind == BlockKind::Handle {
                        b",alloc_type:create"
                    } else {
                        b",alloc_type:alloc"
                    });
                }
            }
        }
        // SAFETY: only ASCII went in (digits, hex digits, ASCII literals, page type names).
        let attr = unsafe { String::from_utf8_unchecked(attr) };
        Row {
            event,
            event_type: b.kind.event_type(),
            name: "N/A".into(),
            ts_ns,
            pid: self.pid,
            tid,
            device: DeviceKey::from_id(b.device),
            ptr: Some(b.addr),
            attr,
            c_stack: None,
            py_stack: None,
        }
    }
}

/// Puts `owner:<o>` where msMemScope writes it: after `used` (before `page_type` on driver
/// MALLOC rows), else at the end.
fn add_owner(attr: &mut String, owner: &str) {
    let entry = format!(",owner:{owner}");
    match attr.find(",page_type:") {
        Some(at) => attr.insert_str(at, &entry),
        None => attr.push_str(&entry),
    }
}

/// A kernel without a name: its handle (and tiling key) or its stub address.
fn kernel_label(
    api: crate::trace::probes::ProbeId,
    kernel: u64,
    tiling_key: Option<u64>,
) -> String {
    match (
        crate::trace::probes::launch_args(api).map(|a| a.kernel),
        tiling_key,
    ) {
        (Some(crate::trace::probes::KernelRef::Handle), Some(t)) => {
            format!("handle_0x{kernel:x}_tiling_{t}")
        }
        (Some(crate::trace::probes::KernelRef::Handle), None) => format!("handle_0x{kernel:x}"),
        _ => format!("0x{kernel:x}"),
    }
}

/// Decimal (as Python prints an int) or `0x` hex.
fn parse_int(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// msMemScope blanks messages that a spreadsheet would run as a formula.
fn guard_formula(text: &str) -> String {
    if text.starts_with(['=', '+', '-', '@']) {
        String::new()
    } else {
        text.to_string()
    }
}

/// The module name for the summary (`UNKNOWN` outside the table, as decompose labels it).
pub fn module_label(id: u32) -> &'static str {
    hal::module_name(id).unwrap_or("UNKNOWN")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::hal::DrvMemProp;

    fn opts() -> TrackOptions {
        TrackOptions {
            dump: EventSet {
                alloc: true,
                free: true,
                launch: false,
                access: false,
            },
            devices: DeviceFilter {
                all_npu: true,
                npu_mask: 0,
                cpu: true,
            },
            steps: StepFilter::default(),
            step_analyses: true,
            oom_top_k: Some(2),
            decompose: false,
            inefficient: true,
            write_op_launch: true,
            write_kernel_launch: true,
        }
    }

    fn ev(tid: u32, call: Call) -> CallEvent {
        CallEvent {
            pid: 100,
            tid,
            ts_mono: 0,
            call,
            at_return: false,
        }
    }

    #[test]
    fn malloc_free_rows_carry_ids_sizes_and_used() {
        let mut p = ProcessState::new(100);
        let o = opts();
        let flag = 1 | (1 << 10) | (1 << 17) | (33u64 << 56);
        let r = p.apply(
            &ev(
                7,
                Call::HalAlloc {
                    size: 4096,
                    flag,
                    ret: 0,
                    addr: Some(0xa000),
                },
            ),
            10,
            &o,
            None,
        );
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].device, DeviceKey::Npu(1));
        assert_eq!(
            r[0].attr,
            "allocation_id:1,addr:0x000000000000a000,size:4096,used:4096,page_type:huge,alloc_type:alloc"
        );
        p.apply(
            &ev(
                7,
                Call::HalAlloc {
                    size: 100,
                    flag: 1 | (1 << 10),
                    ret: 0,
                    addr: Some(0xb000),
                },
            ),
            11,
            &o,
            None,
        );
        let r = p.apply(
            &ev(
                8,
                Call::HalFree {
                    addr: 0xa000,
                    ret: 0,
                },
            ),
            12,
            &o,
            None,
        );
        assert_eq!(r[0].event, "FREE");
        assert_eq!(r[0].tid, 8);
        assert_eq!(
            r[0].attr,
            "allocation_id:1,addr:0x000000000000a000,size:4096,used:100"
        );
        // Unknown and failed frees write nothing but are counted.
        assert!(
            p.apply(
                &ev(
                    8,
                    Call::HalFree {
                        addr: 0xdead,
                        ret: 0
                    }
                ),
                13,
                &o,
                None
            )
            .is_empty()
        );
        assert!(
            p.apply(
                &ev(
                    8,
                    Call::HalFree {
                        addr: 0xb000,
                        ret: 1
                    }
                ),
                13,
                &o,
                None
            )
            .is_empty()
        );
        assert!(
            p.apply(
                &ev(
                    8,
                    Call::HalAlloc {
                        size: 1,
                        flag: 0,
                        ret: 1,
                        addr: Some(0)
                    }
                ),
                13,
                &o,
                None
            )
            .is_empty()
        );
        assert_eq!(p.stats.unmatched_frees, 1);
        assert_eq!(p.stats.failed_frees, 1);
        assert_eq!(p.stats.failed_allocs, 1);
        assert_eq!(p.live_blocks().len(), 1);
    }

    #[test]
    fn host_create_steps_and_marks() {
        let mut p = ProcessState::new(100);
        let o = opts();
        let r = p.apply(
            &ev(
                1,
                Call::RangeStart {
                    text: "step start".into(),
                    id: 5,
                },
            ),
            1,
            &o,
            None,
        );
        assert_eq!(r[0].name, "\"step start\"");
        assert_eq!(r[0].device, DeviceKey::NotApplicable);
        p.apply(&ev(1, Call::SetDevice { device: 3, ret: 0 }), 1, &o, None);
        let r = p.apply(
            &ev(
                1,
                Call::Mark {
                    text: "=cmd".into(),
                },
            ),
            2,
            &o,
            None,
        );
        assert_eq!((&*r[0].name, r[0].device), ("\"\"", DeviceKey::Npu(3)));
        let r = p.apply(
            &ev(
                1,
                Call::HalAlloc {
                    size: 64,
                    flag: 2 << 10,
                    ret: 0,
                    addr: Some(0x55),
                },
            ),
            3,
            &o,
            None,
        );
        assert_eq!((r[0].event_type, r[0].device), ("HOST", DeviceKey::Cpu));
        assert_eq!(
            r[0].attr,
            "allocation_id:1,addr:0x0000000000000055,size:64,pinned:true,used:64"
        );
        let prop = DrvMemProp {
            side: 0,
            devid: 2,
            module_id: 7,
            pg_type: 2,
            mem_type: 0,
        };
        let r = p.apply(
            &ev(
                1,
                Call::HalCreate {
                    size: 8,
                    flag: 0,
                    prop: Some(prop),
                    ret: 0,
                    handle: Some(0x77),
                },
            ),
            4,
            &o,
            None,
        );
        assert!(r[0].attr.ends_with("page_type:giant,alloc_type:create"));
        assert_eq!(r[0].device, DeviceKey::Npu(2));
        let r = p.apply(&ev(1, Call::RangeEnd { id: 5 }), 5, &o, None);
        assert_eq!(r[0].name, "\"Range end from id 5\"");
        let live = p.live_blocks();
        assert_eq!(live.len(), 2);
        assert!(live.iter().all(|b| b.step == 1));
        let r = p.apply(
            &ev(
                1,
                Call::HalRelease {
                    handle: 0x77,
                    ret: 0,
                },
            ),
            6,
            &o,
            None,
        );
        assert_eq!(r[0].event, "FREE");
        assert_eq!(p.stats.releases, 1);
    }

    #[test]
    fn device_filter_and_dump_filter() {
        let mut p = ProcessState::new(100);
        let mut o = opts();
        o.devices = DeviceFilter {
            all_npu: false,
            npu_mask: 1 << 2,
            cpu: false,
        };
        assert!(
            p.apply(
                &ev(
                    1,
                    Call::HalAlloc {
                        size: 1,
                        flag: 1 | (1 << 10),
                        ret: 0,
                        addr: Some(1)
                    }
                ),
                1,
                &o,
                None
            )
            .is_empty()
        );
        assert!(
            p.apply(
                &ev(
                    1,
                    Call::HalAlloc {
                        size: 1,
                        flag: 2 << 10,
                        ret: 0,
                        addr: Some(2)
                    }
                ),
                1,
                &o,
                None
            )
            .is_empty()
        );
        assert_eq!(p.stats.filtered, 2);
        // The frees of blocks left out are left out too, not counted as unknown frees.
        assert!(
            p.apply(&ev(1, Call::HalFree { addr: 2, ret: 0 }), 1, &o, None)
                .is_empty()
        );
        assert_eq!((p.stats.filtered, p.stats.unmatched_frees), (3, 0));
        assert_eq!(
            p.apply(
                &ev(
                    1,
                    Call::HalAlloc {
                        size: 1,
                        flag: 2 | (1 << 10),
                        ret: 0,
                        addr: Some(3)
                    }
                ),
                1,
                &o,
                None
            )
            .len(),
            1
        );
        o.dump.alloc = false;
        assert!(
            p.apply(
                &ev(
                    1,
                    Call::HalAlloc {
                        size: 1,
                        flag: 2 | (1 << 10),
                        ret: 0,
                        addr: Some(4)
                    }
                ),
                1,
                &o,
                None
            )
            .is_empty()
        );
        assert_eq!(p.live_blocks().len(), 2, "collected even when not written");
    }

    #[test]
    fn reused_live_address_closes_the_old_block() {
        let mut p = ProcessState::new(100);
        let o = opts();
        p.apply(
            &ev(
                1,
                Call::HalAlloc {
                    size: 10,
                    flag: 1 << 10,
                    ret: 0,
                    addr: Some(0x10),
                },
            ),
            1,
            &o,
            None,
        );
        let r = p.apply(
            &ev(
                1,
                Call::HalAlloc {
                    size: 20,
                    flag: 1 << 10,
                    ret: 0,
                    addr: Some(0x10),
                },
            ),
            2,
            &o,
            None,
        );
        assert_eq!(
            r.iter().map(|r| r.event).collect::<Vec<_>>(),
            ["FREE", "MALLOC"]
        );
        assert!(r[1].attr.contains("used:20"));
        assert_eq!(p.stats.double_mallocs, 1);
    }

    #[test]
    fn step_filter_keeps_only_listed_steps_with_their_own_range_rows() {
        let mut p = ProcessState::new(100);
        let mut o = opts();
        o.steps = StepFilter::new(&[2]);
        let alloc = |p: &mut ProcessState, addr| {
            p.apply(
                &ev(
                    1,
                    Call::HalAlloc {
                        size: 1,
                        flag: 1 << 10,
                        ret: 0,
                        addr: Some(addr),
                    },
                ),
                1,
                &o,
                None,
            )
            .len()
        };
        assert_eq!(alloc(&mut p, 1), 0, "before any step");
        for (step, id) in [(1u64, 10u64), (2, 11), (3, 12)] {
            let start = p.apply(
                &ev(
                    1,
                    Call::RangeStart {
                        text: "step start".into(),
                        id,
                    },
                ),
                1,
                &o,
                None,
            );
            let inside = alloc(&mut p, 100 + step);
            let end = p.apply(&ev(1, Call::RangeEnd { id }), 1, &o, None);
            let kept = step == 2;
            assert_eq!(
                (start.len(), inside, end.len()),
                if kept { (1, 1, 1) } else { (0, 0, 0) }
            );
        }
        assert_eq!(alloc(&mut p, 2), 0, "after the step");
        assert_eq!(p.live_blocks().len(), 5, "every block is still tracked");
    }

    #[test]
    fn oom_reports_trigger_recent_and_largest_blocks_throttled() {
        let mut p = ProcessState::new(100);
        let o = opts(); // oom top-K 2
        let alloc = |p: &mut ProcessState, addr: u64, size: u64, ts: u64, stack: &str| {
            let call = Call::HalAlloc {
                size,
                flag: 1 << 10,
                ret: 0,
                addr: Some(addr),
            };
            p.apply(&ev(1, call), ts, &o, Some(std::sync::Arc::from(stack)));
        };
        alloc(&mut p, 0x1000, 100, 1, "s1");
        alloc(&mut p, 0x2000, 300, 2, "s2");
        alloc(&mut p, 0x3000, 200, 3, "s3");
        let fail = Call::HalAlloc {
            size: 999,
            flag: 1 << 10,
            ret: 6,
            addr: None,
        };
        let rows = p.apply(
            &ev(1, fail.clone()),
            5_000,
            &o,
            Some(std::sync::Arc::from("oom-stack")),
        );
        let kinds: Vec<_> = rows.iter().map(|r| (r.event_type, &*r.name)).collect();
        assert_eq!(
            kinds,
            [
                ("OOM_TRIGGER", "OOM_Trigger"),
                ("OOM_RECENT_ALLOC", "OOM_RecentAlloc"),
                ("OOM_RECENT_ALLOC", "OOM_RecentAlloc"),
                ("OOM_TOP_ALLOC", "OOM_TopAlloc"),
                ("OOM_TOP_ALLOC", "OOM_TopAlloc"),
            ]
        );
        assert_eq!(
            rows[0].attr,
            format!("func:halMemAlloc,req_size:999,flag:{}", 1 << 10)
        );
        assert_eq!(rows[0].c_stack.as_deref(), Some("oom-stack"));
        // Most recent first: 0x3000 then 0x2000; largest first: 0x2000 then 0x3000.
        assert_eq!(
            rows[1].attr,
            "pool:HAL,ptr:0x0000000000003000,size:200,timestamp:3"
        );
        assert_eq!(
            rows[2].attr,
            "pool:HAL,ptr:0x0000000000002000,size:300,timestamp:2"
        );
        assert_eq!(
            rows[3].attr,
            "pool:HAL,ptr:0x0000000000002000,size:300,timestamp:2"
        );
        assert_eq!(
            rows[4].attr,
            "pool:HAL,ptr:0x0000000000003000,size:200,timestamp:3"
        );
        assert_eq!(
            rows[1].c_stack.as_deref(),
            Some("s3"),
            "the allocation's stack"
        );
        // Within 2 s: only the trigger; after: the details again.
        assert_eq!(
            p.apply(&ev(1, fail.clone()), 1_000_000_000, &o, None).len(),
            1
        );
        assert_eq!(p.apply(&ev(1, fail), 2_000_005_000, &o, None).len(), 5);
        assert_eq!(p.stats.ooms, 3);
        // Other failures are not OOM.
        let other = Call::HalAlloc {
            size: 1,
            flag: 0,
            ret: 1,
            addr: None,
        };
        assert!(p.apply(&ev(1, other), 9_000_000_000, &o, None).is_empty());
    }

    #[test]
    fn decompose_labels_owners_and_adds_up_per_layer() {
        let mut p = ProcessState::new(100);
        let mut o = opts();
        o.decompose = true;
        let hal = |flag: u64, size, addr| Call::HalAlloc {
            size,
            flag,
            ret: 0,
            addr: Some(addr),
        };
        let r = p.apply(
            &ev(1, hal((1 << 10) | (3u64 << 56), 4096, 0x10)),
            1,
            &o,
            None,
        );
        assert!(
            r[0].attr
                .contains(",used:4096,owner:CANN@HCCL,page_type:normal"),
            "{}",
            r[0].attr
        );
        p.apply(
            &ev(1, hal((1 << 10) | (200u64 << 56), 100, 0x20)),
            2,
            &o,
            None,
        );
        p.apply(
            &ev(
                1,
                Call::DomainCreate {
                    name: "ptaCaching".into(),
                    handle: 7,
                },
            ),
            3,
            &o,
            None,
        );
        let region = crate::events::decode::RegionDesc {
            device: 0,
            ptr: 0x10,
            size: 1000,
            handle: 0,
        };
        let r = p.apply(
            &ev(
                1,
                Call::RegionsRegister {
                    domain: 7,
                    regions: vec![region],
                    first: 0,
                    total: 1,
                },
            ),
            4,
            &o,
            None,
        );
        assert!(r[0].attr.ends_with(",owner:PTA"), "{}", r[0].attr);
        p.apply(&ev(1, Call::HalFree { addr: 0x20, ret: 0 }), 5, &o, None);
        let owners = p.decompose.owners();
        assert_eq!(owners["CANN@HCCL"].current, 4096);
        assert_eq!(
            (owners["CANN@UNKNOWN"].current, owners["CANN@UNKNOWN"].peak),
            (0, 100)
        );
        assert_eq!(owners["PTA"].current, 1000);
        // Each layer adds up: driver owners to the live driver blocks, pools to their regions.
        let driver: u64 = owners
            .iter()
            .filter(|(k, _)| k.starts_with("CANN@"))
            .map(|(_, v)| v.current)
            .sum();
        assert_eq!(driver, p.live_blocks().iter().map(|b| b.size).sum::<u64>());
    }

    #[test]
    fn labels_ops_tag_and_addr_relabel_move_bytes_between_owners() {
        let mut p = ProcessState::new(100);
        let mut o = opts();
        o.decompose = true;
        let mark = |text: &str| Call::Mark { text: text.into() };
        let region = |ptr, size| crate::events::decode::RegionDesc {
            device: 0,
            ptr,
            size,
            handle: 0,
        };
        let register = |r: Vec<crate::events::decode::RegionDesc>| Call::RegionsRegister {
            domain: 7,
            regions: r,
            first: 0,
            total: 1,
        };
        let mut t = 0;
        let mut apply = |p: &mut ProcessState, tid, call| {
            t += 1;
            p.apply(&ev(tid, call), t, &o, None)
        };
        apply(
            &mut p,
            1,
            Call::DomainCreate {
                name: "ptaCaching".into(),
                handle: 7,
            },
        );
        apply(&mut p, 1, mark("memscope-label-push: level=1;label=vllm"));
        apply(
            &mut p,
            1,
            mark("memscope-label-push: level=3;label=weights"),
        );
        // Another thread's labels do not apply to thread 1, and vice versa.
        apply(&mut p, 2, mark("memscope-label-push: level=5;label=mine"));
        let r = apply(&mut p, 1, register(vec![region(0x1000, 100)]));
        assert!(
            r[0].attr.ends_with(",owner:PTA@vllm@weights"),
            "{}",
            r[0].attr
        );
        let r = apply(&mut p, 2, register(vec![region(0x2000, 50)]));
        assert!(r[0].attr.ends_with(",owner:PTA@mine"), "{}", r[0].attr);
        apply(&mut p, 1, mark("memscope-label-pop: level=3;label=weights"));
        apply(&mut p, 1, mark("memscope-label-pop: level=1;label=vllm"));
        let r = apply(&mut p, 1, register(vec![region(0x3000, 10)]));
        assert!(r[0].attr.ends_with(",owner:PTA"), "{}", r[0].attr);
        // Label marks are neither MSTX rows nor counted as marks.
        assert_eq!(p.stats.marks, 0);

        // An ATen access tags DETAIL_2 "ops" when it is empty; a second one changes nothing.
        let access = |ptr: u64| {
            mark(&format!(
                "memscope-aten-ac:ptr={ptr};is_write=True;is_read=False;is_output=True;name=op;shape=[1];dtype=torch.float16;tensor_size=2;device=npu:0"
            ))
        };
        apply(&mut p, 1, access(0x3004));
        apply(&mut p, 1, access(0x3004));
        apply(&mut p, 1, access(0x1000));
        // describe_addr: relabel the block holding 0x2010 at level 4, over the weak tag's level.
        apply(
            &mut p,
            1,
            mark("memscope-label-addr: ptr=0x2010;level=4;label=kv"),
        );
        apply(
            &mut p,
            1,
            mark("memscope-label-addr: ptr=0x9999;level=4;label=x"),
        );
        apply(&mut p, 1, mark("memscope-label-push: level=9;label=x"));
        assert_eq!(p.messages.len(), 2, "{:?}", p.messages);
        let owners = p.decompose.owners();
        let cur = |k: &str| owners.get(k).map(|b| (b.current, b.peak));
        assert_eq!(cur("PTA@vllm@weights@ops"), Some((100, 100)));
        assert_eq!(cur("PTA@vllm@weights"), Some((0, 100)));
        assert_eq!(cur("PTA@ops"), Some((10, 10)));
        assert_eq!(cur("PTA"), Some((0, 10)));
        assert_eq!(cur("PTA@kv@mine"), Some((50, 50)));
        // The owners still add up to the live pool memory.
        let live: u64 = owners.values().map(|b| b.current).sum();
        assert_eq!(live, 160);
    }

    #[test]
    fn runtime_launches_inside_an_aclrt_launch_are_not_counted_twice() {
        let mut p = ProcessState::new(100);
        let mut o = opts();
        o.dump.launch = true;
        let launch = |api, duration_ns| Call::KernelLaunch {
            api,
            kernel: 0x40,
            tiling_key: None,
            stream: 0x99,
            name: Some("k".into()),
            duration_ns,
        };
        let acl = launch(
            crate::trace::probes::ProbeId::AclrtLaunchKernelWithConfig,
            Some(100),
        );
        let rt = launch(
            crate::trace::probes::ProbeId::RtKernelLaunchWithHandleV2,
            None,
        );
        let mut rows = Vec::new();
        rows.extend(p.apply(&ev(1, acl.clone()), 1000, &o, None));
        // Inside the aclrt* call on its thread: its own runtime launch.
        rows.extend(p.apply(&ev(1, rt.clone()), 1050, &o, None));
        rows.extend(p.apply(&ev(1, rt.clone()), 1100, &o, None));
        // Another thread at the same time, and the same thread afterwards: real launches.
        rows.extend(p.apply(&ev(2, rt.clone()), 1060, &o, None));
        rows.extend(p.apply(&ev(1, rt), 1101, &o, None));
        assert_eq!(rows.len(), 3);
        assert_eq!(p.stats.launches, 3);
        assert_eq!(p.stats.nested_launches, 2);
        let tasks: Vec<&str> = rows.iter().map(|r| r.attr.as_str()).collect();
        assert_eq!(
            tasks,
            [
                "streamId:0,taskId:0",
                "streamId:0,taskId:1",
                "streamId:0,taskId:2"
            ]
        );
    }

    #[test]
    fn atb_operators_and_accesses_feed_their_own_inefficient_analysis() {
        use crate::events::decode::{AtbEvent, AtbTensor, RegionDesc, RegionRef};
        let mut p = ProcessState::new(100);
        let mut o = opts();
        o.dump.access = true;
        let mut t = 0;
        let mut apply = |p: &mut ProcessState, call| {
            t += 1;
            p.apply(&ev(1, call), t, &o, None)
        };
        let atb = |object, event| Call::Atb {
            object,
            pack: object * 10,
            event,
        };
        let region = |ptr| RegionDesc {
            device: 0,
            ptr,
            size: 64,
            handle: 0,
        };
        let tensor = |addr| AtbTensor {
            addr,
            size: 16,
            dtype: 1,
            format: 2,
            shape: vec![4, 2],
        };
        apply(
            &mut p,
            Call::DomainCreate {
                name: "atb".into(),
                handle: 8,
            },
        );
        apply(
            &mut p,
            Call::HeapRegister {
                domain: 8,
                heap: 0x77,
                range: Some(RegionDesc {
                    device: 0,
                    ptr: 0x1000,
                    size: 0x10000,
                    handle: 0,
                }),
            },
        );
        let start = |p: &mut ProcessState,
                     apply: &mut dyn FnMut(&mut ProcessState, Call) -> Vec<Row>,
                     runner: u64| {
            apply(p, atb(runner, AtbEvent::Name(format!("op{runner}"))));
            apply(p, atb(runner, AtbEvent::Dir("d".into())));
            apply(
                p,
                atb(
                    runner,
                    AtbEvent::Pack {
                        workspace: 0,
                        workspace_size: 0,
                    },
                ),
            )
        };
        let uses = |runner, addr| {
            atb(
                runner,
                AtbEvent::Tensors {
                    output: false,
                    after: false,
                    tensors: vec![tensor(addr)],
                    first: 0,
                },
            )
        };
        let register = |ptr| Call::RegionsRegister {
            domain: 8,
            regions: vec![region(ptr)],
            first: 0,
            total: 1,
        };
        let unregister = |ptr| Call::RegionsUnregister {
            domain: 8,
            refs: vec![RegionRef::Pointer(ptr)],
            first: 0,
            total: 1,
        };
        // op 1 allocates A (0x1000) and B (0x2000) and uses B.
        let r = start(&mut p, &mut apply, 1);
        assert_eq!(r[0].event_type, "ATB_START");
        apply(&mut p, register(0x1000));
        apply(&mut p, register(0x2000));
        let r = apply(&mut p, uses(1, 0x2008));
        assert_eq!(
            r[0].attr,
            "allocation_id:2,addr:0x0000000000002000,size:64,type:ATB,dtype:1,format:2,shape:[4,2,]"
        );
        assert_eq!(
            apply(&mut p, atb(1, AtbEvent::End))[0].event_type,
            "ATB_END"
        );
        // op 2 frees B; op 3 first uses A: early allocation of A.
        start(&mut p, &mut apply, 2);
        apply(&mut p, unregister(0x2000));
        apply(&mut p, atb(2, AtbEvent::End));
        start(&mut p, &mut apply, 3);
        apply(&mut p, uses(3, 0x1000));
        apply(&mut p, atb(3, AtbEvent::End));
        let r = apply(&mut p, unregister(0x1000));
        assert!(
            r[0].attr.ends_with(",inefficient_type:early_allocation"),
            "{}",
            r[0].attr
        );
        assert_eq!(
            p.inefficient_blocks(),
            vec![(1, "early_allocation".to_string())]
        );
        // The PTA analysis saw none of it.
        assert_eq!(p.inefficient.flagged().count(), 0);
        assert_eq!((p.stats.ops, p.stats.accesses), (3, 2));
    }

    #[test]
    fn aten_marks_give_op_and_access_rows_and_feed_inefficient() {
        let mut p = ProcessState::new(100);
        let mut o = opts();
        o.dump.access = true;
        let mark = |p: &mut ProcessState, t: &str| {
            p.apply(&ev(1, Call::Mark { text: t.into() }), 1, &o, None)
        };
        let region = |ptr, size| crate::events::decode::RegionDesc {
            device: 0,
            ptr,
            size,
            handle: 0,
        };
        let reg = |p: &mut ProcessState, ptr, size| {
            p.apply(
                &ev(
                    1,
                    Call::RegionsRegister {
                        domain: 7,
                        regions: vec![region(ptr, size)],
                        first: 0,
                        total: 1,
                    },
                ),
                1,
                &o,
                None,
            )
        };
        let unreg = |p: &mut ProcessState, ptr| {
            p.apply(
                &ev(
                    1,
                    Call::RegionsUnregister {
                        domain: 7,
                        refs: vec![crate::events::decode::RegionRef::Pointer(ptr)],
                        first: 0,
                        total: 1,
                    },
                ),
                1,
                &o,
                None,
            )
        };
        p.apply(
            &ev(
                1,
                Call::DomainCreate {
                    name: "ptaCaching".into(),
                    handle: 7,
                },
            ),
            1,
            &o,
            None,
        );
        let b = "memscope-aten-b: name=torch._ops.aten.addmm.default";
        let e = "memscope-aten-e: name=torch._ops.aten.addmm.default";
        let ac = |ptr: u64, w: &str| {
            format!(
                "memscope-aten-ac:ptr={ptr};is_write={w};is_read=True;is_output=False;name=torch._ops.aten.addmm.default;shape=torch.Size([2, 4]);dtype=torch.float16;tensor_size=16;device=npu:0"
            )
        };
        // op 1 allocates blocks A (0x1000) and B (0x2000) and uses B.
        let r = mark(&mut p, b);
        assert_eq!(
            (r[0].event, r[0].event_type, &*r[0].name),
            ("OP_LAUNCH", "ATEN_START", "torch._ops.aten.addmm.default")
        );
        reg(&mut p, 0x1000, 64);
        reg(&mut p, 0x2000, 64);
        let r = mark(&mut p, &ac(0x2000 + 8, "False"));
        assert_eq!((r[0].event, r[0].event_type), ("ACCESS", "READ"));
        assert_eq!(r[0].ptr, Some(0x2008));
        assert_eq!(
            r[0].attr,
            "allocation_id:2,addr:0x0000000000002000,size:64,type:PTA,dtype:torch.float16,shape:torch.Size([2, 4])"
        );
        assert_eq!(mark(&mut p, e)[0].event_type, "ATEN_END");
        // op 2 frees B; op 3 first uses A: early allocation of A.
        mark(&mut p, b);
        unreg(&mut p, 0x2000);
        mark(&mut p, e);
        mark(&mut p, b);
        assert_eq!(mark(&mut p, &ac(4096, "True"))[0].event_type, "WRITE");
        mark(&mut p, e);
        let r = unreg(&mut p, 0x1000);
        assert!(
            r[0].attr.ends_with(",inefficient_type:early_allocation"),
            "{}",
            r[0].attr
        );
        assert_eq!(
            p.inefficient_blocks(),
            vec![(1, "early_allocation".to_string())]
        );
        assert_eq!((p.stats.ops, p.stats.accesses, p.stats.marks), (3, 2, 0));
        // An access outside every live block is counted, not written.
        assert!(mark(&mut p, &ac(0x9000, "True")).is_empty());
        assert_eq!(p.stats.unmatched_accesses, 1);
    }
}
