//! Live blocks: allocation ids, inserting and closing blocks, frees of unknown addresses, and
//! the out-of-memory report drawn from the live blocks.

use super::{Block, BlockKind, DeviceKey, OOM_DETAIL_INTERVAL_NS, ProcessState, Row, TrackOptions};
use crate::events::hal::PageType;
use crate::events::pools::PoolKind;

impl ProcessState {
    /// An allocation failed for lack of memory (spec §6.6): the trigger row, then, at most
    /// every 2 s, the K most recent and the K largest live blocks (the process's HAL blocks
    /// and the pools' blocks on that device).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn oom(
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
            size: None,
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
                    // HAL, or CUDA for the CUDA runtime's and driver's memory.
                    _ => b.event_type(),
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
}

impl ProcessState {
    pub(super) fn note_unmatched(&mut self, addr: u64, _opts: &TrackOptions) {
        if self.filtered_addrs.remove(&addr) {
            self.stats.filtered += 1;
        } else {
            self.stats.unmatched_frees += 1;
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn new_block(
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
            py_stack: self.current_py_stack.clone(),
            kernel_index: self.kernel_index,
            labels: None,
        }
    }

    pub(super) fn insert_block(
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
            let mut row = self.memory_row("MALLOC", &block, block.tid, ts_ns, true, opts);
            if opts.decompose && opts.row_attrs {
                add_owner(&mut row.attr, &block.owner());
            }
            rows.push(row);
        }
        if !handle
            && block.kind == BlockKind::Device
            && let Some(index) = &mut self.device_index
        {
            index.insert(block.addr, block.size);
        }
        let table = if handle {
            &mut self.live_handles
        } else {
            &mut self.live
        };
        table.insert(block.addr, block);
    }
}

/// Puts `owner:<o>` where msMemScope writes it: after `used` (before `page_type` on driver
/// MALLOC rows), else at the end.
pub(super) fn add_owner(attr: &mut String, owner: &str) {
    let entry = format!(",owner:{owner}");
    match attr.find(",page_type:") {
        Some(at) => attr.insert_str(at, &entry),
        None => attr.push_str(&entry),
    }
}
