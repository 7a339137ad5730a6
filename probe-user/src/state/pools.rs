//! Framework pool regions (mstx memory API): blocks registered and freed inside pools.

use super::{BlockKind, ProcessState, Row, TrackOptions};
use crate::analysis::inefficient;
use crate::analysis::inefficient::MemEvent;
use crate::events::hal::PageType;
use crate::events::pools::{PoolKind, RegionChange};

impl ProcessState {
    pub(super) fn pool_malloc(
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
        self.note_pool_totals(c);
        self.note_pool_segment(c.pool, c.addr, c.size);
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
        // MindSpore takes each workspace from its pool as a block of its own, and gives it back
        // before its launch thread runs the operator, as torch_npu may.
        if matches!(
            c.pool,
            PoolKind::PtaCaching | PoolKind::PtaWorkspace | PoolKind::MindSpore
        ) {
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
                rows.push(self.pool_row("FREE", &old, old.tid, ts_ns, c, opts));
            }
            if opts.decompose {
                self.decompose.on_free(&old.owner(), old.size);
            }
        }
        if opts.decompose {
            self.decompose.on_alloc(&block.owner(), block.size);
        }
        if opts.dump.alloc {
            let mut row = self.pool_row("MALLOC", &block, tid, ts_ns, c, opts);
            if opts.decompose && opts.row_attrs {
                row.attr.push_str(",owner:");
                row.attr.push_str(&block.owner());
            }
            if opts.row_attrs
                && let Some(range) = self.vmm_attr(c.addr)
            {
                row.attr.push(',');
                row.attr.push_str(&range);
            }
            rows.push(row);
        }
    }

    pub(super) fn pool_free(
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
        if self.wants_device(opts, c.device) {
            self.note_pool_totals(c);
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
            let mut row = self.pool_row("FREE", &block, tid, ts_ns, c, opts);
            // The MALLOC row was written before the block's accesses were known: the
            // classification goes on its FREE row (and into the summary).
            if !found.is_empty() && opts.row_attrs {
                row.attr.push_str(",inefficient_type:");
                row.attr.push_str(&found);
            }
            rows.push(row);
        }
    }
}

impl ProcessState {
    /// The allocation id of the pool block an operator's workspace lies in (PTA's or
    /// MindSpore's): the last one
    /// allocated at that address (the framework may hand the block back to its pool before a
    /// queued operator runs: stream order keeps that safe), else a live block holding it.
    pub(super) fn workspace_block(&self, addr: u64) -> Option<u64> {
        if addr == 0 {
            return None;
        }
        self.pta_last_at.get(&addr).copied().or_else(|| {
            let (_, start) = self.pta_by_addr.range(..=addr).next_back()?;
            let b = self.pool_blocks.get(&(PoolKind::PtaCaching, *start))?;
            (addr < b.addr + b.size).then_some(b.allocation_id)
        })
    }
}

impl ProcessState {
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
}
