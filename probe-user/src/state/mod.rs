//! Per-process memory state: live blocks, running `used` totals, steps and the current device
//! of each thread. Turns decoded calls into output rows and keeps what the analyses need.
//!
//! Stage 3. The concerns are files: live blocks (`blocks`), the one dispatcher from a call to
//! its changes (`calls`), the CUDA runtime's and c10's (`cuda`), devices and `DeviceKey` (`devices`), ATen/ATB operators (`ops`),
//! decompose owners (`owners`), framework pool regions (`pools`), the rows and `Row` itself
//! (`rows`: the row is defined where it is built; `output` only writes it), mstx steps
//! (`steps`), reserved and mapped device ranges (`vmm`).
//!
//! Uses `events`, `trace` (probe ids, op names), `settings`, `digits`, and the
//! online analyzers of `analysis` it feeds as each call is applied (decompose, inefficient,
//! step leaks). Never `session`, `output`, `report`, `offline` or `agent` (tests/layout.rs).

mod blocks;
mod calls;
mod cuda;
mod devices;
mod exit;
mod ops;
mod owners;
mod pools;
mod rows;
mod steps;
mod tasks;
#[cfg(test)]
mod tests;
mod vmm;

pub use devices::DeviceKey;
pub use exit::{ExitMemory, PoolHeld, PoolSegments, TensorLeak};
pub use rows::{Row, quote_text};
pub use steps::StepFilter;

use crate::analysis::decompose::Decompose;
use crate::analysis::inefficient::InefficientAnalyzer;
use crate::analysis::steps::{Gaps, StepLeaks};
use crate::events::decode::CallEvent;
use crate::events::hal::PageType;
use crate::events::labels::{Labels, ThreadLabels};
use crate::events::pools::{PoolKind, Pools};
use crate::events::{hal, labels};
use crate::settings::{DeviceFilter, EventSet};
use std::collections::HashMap;

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
    /// The "Event Type" of a block of this kind (`Block::event_type` says `CUDA` for the CUDA
    /// runtime's).
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
    /// Its Python stack (`--call-stack=python`, on by default for Python programs): the
    /// leak report names the program's line from it.
    pub py_stack: Option<std::sync::Arc<str>>,
    /// Kernel launches the process had made before this allocation.
    pub kernel_index: u64,
    /// Decompose labels of levels 1-7 (`labels.rs`); pool blocks only, with `decompose`.
    pub labels: Option<Box<Labels>>,
}

impl Block {
    /// The "Event Type" of the block's rows: its kind's, but `CUDA` for the CUDA runtime's
    /// device memory and the driver's physical handles (driver memory as the HAL's is on
    /// Ascend).
    pub fn event_type(&self) -> &'static str {
        match self.kind {
            BlockKind::Device | BlockKind::Handle
                if self.module_id == crate::events::cuda::RUNTIME_MODULE =>
            {
                "CUDA"
            }
            kind => kind.event_type(),
        }
    }

    /// The decompose label of the block (spec §2.7): `CANN@<module>` for driver memory (by the
    /// module of the allocation flag, or of `drv_mem_prop`), the pool for pool regions.
    pub fn owner(&self) -> String {
        let framework = match self.kind {
            BlockKind::Pool(PoolKind::PtaCaching) => "PTA",
            BlockKind::Pool(PoolKind::PtaWorkspace) => "PTA_WORKSPACE",
            BlockKind::Pool(PoolKind::MindSpore) => "MINDSPORE",
            BlockKind::Pool(PoolKind::Atb) => "ATB",
            _ if self.module_id == crate::events::cuda::RUNTIME_MODULE => return "CUDA".into(),
            _ => return format!("CANN@{}", module_label(self.module_id)),
        };
        labels::compose(framework, self.labels.as_deref())
    }
}

/// What a framework pool said it held on a device, in its last report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolTotals {
    pub pool: Option<PoolKind>,
    pub device: u32,
    /// Handed out to tensors (`used`; torch's `memory_allocated()`).
    pub allocated: u64,
    /// Reserved from the driver (`total`; torch's `memory_reserved()`).
    pub reserved: u64,
}

impl PoolTotals {
    /// Keeps `t` as its pool's latest figures on its device in `totals`.
    pub fn record(totals: &mut Vec<PoolTotals>, t: PoolTotals) {
        match totals
            .iter_mut()
            .find(|p| p.pool == t.pool && p.device == t.device)
        {
            Some(p) => *p = t,
            None => totals.push(t),
        }
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

/// Hasher for address-keyed maps (and the session's pid- and tid-keyed ones): one multiply
/// instead of SipHash (the keys come from the traced processes and the kernel, not from an
/// adversary; the user-space throughput bench measures it).
pub type AddrHash = std::hash::BuildHasherDefault<AddrHasher>;

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
    /// Driver memory the process had mapped before a `--pid` attach (MindSpore's VMM handles,
    /// read from its memory), added to the device its pool first runs on.
    pub driver_before: u64,
    /// A `--pid` attach to MindSpore without VMM: the driver memory its pool took before is
    /// its own reserved bytes less those seen, counted at the first pool call that read them.
    pub pool_reserved_unseen: bool,
    next_allocation_id: u64,
    step: u32,
    step_range: Option<u64>,
    thread_device: HashMap<u32, u32, AddrHash>,
    /// Blocks left out by `--device`, so their frees are left out too.
    filtered_addrs: std::collections::HashSet<u64>,
    pools: Pools,
    /// Reserved device ranges and the physical handles mapped into them.
    vmm: vmm::Vmm,
    /// MindSpore's pool, from its own functions (no mstx).
    ms_pools: crate::events::mindspore::MindSporePools,
    /// The Python stacks MindSpore's pipeline tasks carry to their worker threads.
    ms_tasks: tasks::TaskStacks,
    pool_blocks: HashMap<(PoolKind, u64), Block>,
    step_leaks: StepLeaks,
    /// The pool blocks the step analysis found outliving a later step, with their stacks,
    /// by allocation id; and the last step end each outlived.
    step_leak_blocks: std::collections::BTreeMap<u64, (Block, u32)>,
    /// Driver blocks (start, end) a framework pool put regions in: the pool's segments,
    /// which it keeps on purpose, so no leak. Sorted by start.
    pool_segments: exit::PoolSegments,
    /// Live device blocks, start -> size, sorted: kept from a process's first pool region on
    /// (a region's segment is found in it), never for a process without pools.
    device_index: Option<std::collections::BTreeMap<u64, u64>>,
    /// The last `used`/`total` each pool reported, per device.
    pool_totals: Vec<PoolTotals>,
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
    /// The allocation id of the last PTA (caching or workspace) or MindSpore block made at each
    /// address: where an operator's workspace came from.
    pta_last_at: HashMap<u64, u64>,
    /// torch_npu's report function got something that is not a `MemoryUsage`: the located
    /// function is not what we think, so nothing more is read from it.
    pta_refused: bool,
    /// The NVTX ranges each thread has open (innermost last), and the last id given.
    nvtx_ranges: HashMap<u32, Vec<u64>>,
    nvtx_next: u64,
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
    /// Format the Attr text of MALLOC and FREE rows. The node agent, which writes no files,
    /// reads only their numbers (`Row::size`) and turns this off: that text was ~5% of its
    /// CPU.
    pub row_attrs: bool,
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
        self.ms_tasks.carry(ev, &mut self.current_py_stack);
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
}

/// The module name for the summary (`UNKNOWN` outside the table, as decompose labels it).
pub fn module_label(id: u32) -> &'static str {
    match id {
        crate::events::cuda::RUNTIME_MODULE => "CUDA",
        _ => hal::module_name(id).unwrap_or("UNKNOWN"),
    }
}
