//! What the CUDA runtime's memory calls and c10's allocator reports do to a process: driver
//! blocks (`cudaMalloc*`, pinned host memory from `cudaMallocHost`/`cudaHostAlloc`, the driver's
//! `cuMemCreate` handles) as the HAL's are on Ascend, written with the event type `CUDA`, and the caching allocator's blocks as the
//! PyTorch pool with its own `memory_allocated()`/`memory_reserved()`; NVTX's push/pop ranges
//! as the mstx ranges they stand for.

use super::{BlockKind, ProcessState, Row, TrackOptions};
use crate::events::cuda::{self, C10Report};
use crate::events::decode::{Call, CallEvent};
use crate::events::hal::{DEVICE_CPU, PageType};
use crate::trace::probes::ProbeId;

/// Ids given to NVTX ranges (which have none: a pop ends the thread's innermost push), above
/// any an mstx library hands out.
const NVTX_RANGE_IDS: u64 = 1 << 62;

/// `cudaErrorMemoryAllocation`.
const CUDA_ERROR_MEMORY_ALLOCATION: i32 = 2;
/// The driver's `CUDA_ERROR_OUT_OF_MEMORY`.
const CUDA_ERROR_OUT_OF_MEMORY: i32 = 2;

impl ProcessState {
    pub(super) fn cuda_alloc(
        &mut self,
        ev: &CallEvent,
        (api, size, ret, addr): (ProbeId, u64, i32, Option<u64>),
        ts_ns: u64,
        opts: &TrackOptions,
        rows: &mut Vec<Row>,
    ) {
        let host = cuda::is_host(api);
        let device = if host {
            DEVICE_CPU
        } else {
            self.pool_device(ev.tid)
        };
        let Some(addr) = addr.filter(|_| ret == 0) else {
            self.stats.failed_allocs += 1;
            if ret == CUDA_ERROR_MEMORY_ALLOCATION
                && let Some(k) = opts.oom_top_k
            {
                let name = crate::trace::probes::PROBES
                    .iter()
                    .find(|p| p.id == api)
                    .map_or("cudaMalloc", |p| p.symbol);
                self.oom(name, size, 0, device, ev.tid, ts_ns, k, rows);
            }
            return;
        };
        if !self.wants_device(opts, device) {
            self.stats.filtered += 1;
            self.filtered_addrs.insert(addr);
            return;
        }
        self.stats.mallocs += 1;
        let kind = if host {
            BlockKind::PinnedHost
        } else {
            BlockKind::Device
        };
        let block = self.new_block(
            addr,
            size,
            device,
            kind,
            ev.tid,
            ts_ns,
            cuda::RUNTIME_MODULE,
            PageType::Normal,
        );
        self.insert_block(block, false, opts, ts_ns, rows);
    }

    /// `cuMemCreate`: a physical handle, the driver memory behind an expandable segment's
    /// mappings (`vmm.rs` makes it the pool's segment once a block lies over its mapping).
    pub(super) fn cuda_create(
        &mut self,
        ev: &CallEvent,
        (size, ret, handle): (u64, i32, Option<u64>),
        ts_ns: u64,
        opts: &TrackOptions,
        rows: &mut Vec<Row>,
    ) {
        let device = self.pool_device(ev.tid);
        let Some(handle) = handle.filter(|_| ret == 0) else {
            self.stats.failed_allocs += 1;
            if ret == CUDA_ERROR_OUT_OF_MEMORY
                && let Some(k) = opts.oom_top_k
            {
                self.oom("cuMemCreate", size, 0, device, ev.tid, ts_ns, k, rows);
            }
            return;
        };
        if !self.wants_device(opts, device) {
            self.stats.filtered += 1;
            self.filtered_addrs.insert(handle);
            return;
        }
        self.stats.creates += 1;
        let block = self.new_block(
            handle,
            size,
            device,
            BlockKind::Handle,
            ev.tid,
            ts_ns,
            cuda::RUNTIME_MODULE,
            PageType::Normal,
        );
        self.insert_block(block, true, opts, ts_ns, rows);
    }

    pub(super) fn cuda_free(
        &mut self,
        ev: &CallEvent,
        addr: u64,
        ret: i32,
        ts_ns: u64,
        opts: &TrackOptions,
        rows: &mut Vec<Row>,
    ) {
        if ret != 0 {
            self.stats.failed_frees += 1;
            return;
        }
        // cudaFree(NULL) initialises the context; it frees nothing.
        if addr == 0 {
            return;
        }
        match self.live.remove(&addr) {
            Some(block) => {
                self.stats.frees += 1;
                self.free_row(&block, ev.tid, ts_ns, opts, rows);
            }
            None => self.note_unmatched(addr, opts),
        }
    }

    pub(super) fn c10_usage(
        &mut self,
        ev: &CallEvent,
        report: &C10Report,
        ts_ns: u64,
        opts: &TrackOptions,
        rows: &mut Vec<Row>,
    ) {
        let Some((malloc, change)) = report.change() else {
            return;
        };
        if malloc {
            self.pool_malloc(change, ev.tid, ts_ns, opts, rows);
        } else {
            self.pool_free(change, ev.tid, ts_ns, opts, rows);
        }
    }

    /// An NVTX push or pop as the mstx range start or end it stands for (None: a pop with no
    /// push seen, e.g. one pushed before `--pid` attached).
    pub(super) fn nvtx_as_mstx(&mut self, ev: &CallEvent) -> Option<CallEvent> {
        let call = match &ev.call {
            Call::RangePush { text } => {
                self.nvtx_next += 1;
                let id = NVTX_RANGE_IDS + self.nvtx_next;
                self.nvtx_ranges.entry(ev.tid).or_default().push(id);
                Call::RangeStart {
                    text: text.clone(),
                    id,
                }
            }
            Call::RangePop => Call::RangeEnd {
                id: self.nvtx_ranges.get_mut(&ev.tid)?.pop()?,
            },
            _ => return None,
        };
        Some(CallEvent { call, ..ev.clone() })
    }
}
