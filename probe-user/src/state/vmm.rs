//! Virtual memory management: device address ranges reserved (`aclrtReserveMemAddress`) and
//! physical handles (`halMemCreate`, through `aclrtMallocPhysical`) mapped into them
//! (`aclrtMapMem`), as MindSpore's pool (VMM on by default) and torch_npu's expandable
//! segments use them. A pool block in a mapped range links to the handle behind it: that
//! handle is the pool's segment (cached, never a leak), as a `halMemAlloc` block holding pool
//! blocks is; and each pool block's MALLOC row names the reserved range it lies in.

use std::collections::BTreeMap;

use super::{BlockKind, ProcessState};
use crate::events::pools::PoolKind;

#[derive(Debug, Default)]
pub(super) struct Vmm {
    /// Reserved ranges: start -> size.
    reserved: BTreeMap<u64, u64>,
    /// Mappings: start -> (size, handle).
    mapped: BTreeMap<u64, (u64, u64)>,
}

impl Vmm {
    /// The reserved range holding `addr`: (start, size).
    pub(super) fn range_of(&self, addr: u64) -> Option<(u64, u64)> {
        let (start, size) = self.reserved.range(..=addr).next_back()?;
        (addr < start + size).then_some((*start, *size))
    }

    /// The handles mapped over any part of `[addr, addr + size)`.
    fn handles_over(&self, addr: u64, size: u64) -> Vec<u64> {
        let end = addr.saturating_add(size.max(1));
        // The mapping holding `addr`, then every one starting inside the block.
        let first = self.mapped.range(..=addr).next_back().map(|(s, _)| *s);
        let from = first.unwrap_or(addr);
        self.mapped
            .range(from..end)
            .filter(|(start, (len, _))| **start < end && *start + *len > addr)
            .map(|(_, (_, handle))| *handle)
            .collect()
    }
}

impl ProcessState {
    pub(super) fn vmm_reserved(&mut self, addr: u64, size: u64) {
        self.vmm.reserved.insert(addr, size);
    }

    pub(super) fn vmm_released(&mut self, addr: u64) {
        self.vmm.reserved.remove(&addr);
    }

    /// A handle mapped at `addr`: it becomes the segment of a pool with a block over it
    /// already (a pool may map the memory behind a block after handing the block out; a big
    /// block lies over several mappings).
    pub(super) fn vmm_mapped(&mut self, addr: u64, size: u64, handle: u64) {
        self.vmm.mapped.insert(addr, (size, handle));
        let end = addr.saturating_add(size);
        let pool = self
            .pool_blocks
            .iter()
            .find(|((_, a), b)| *a < end && a.saturating_add(b.size) > addr)
            .map(|((pool, _), _)| *pool);
        if let Some(pool) = pool {
            self.note_handle_segment(pool, handle);
        }
    }

    pub(super) fn vmm_unmapped(&mut self, addr: u64) {
        self.vmm.mapped.remove(&addr);
    }

    /// For a pool block at `[addr, addr + size)`: the handles mapped behind it are the pool's
    /// segments. Returns false when no mapping lies under it (then the block may lie in a
    /// `halMemAlloc` block).
    pub(super) fn note_mapped_segments(&mut self, pool: PoolKind, addr: u64, size: u64) -> bool {
        let handles = self.vmm.handles_over(addr, size);
        for handle in &handles {
            self.note_handle_segment(pool, *handle);
        }
        !handles.is_empty()
    }

    fn note_handle_segment(&mut self, pool: PoolKind, handle: u64) {
        let Some(b) = self.live_handles.get(&handle) else {
            return;
        };
        debug_assert_eq!(b.kind, BlockKind::Handle);
        // A handle is a host pointer, not a device range: the segment is that one address
        // (handles lie closer together than their sizes).
        self.pool_segments.note(pool, handle, || Some((handle, 1)));
    }

    /// `vmm_range:0xSTART` of the reserved range a pool block lies in, for its row.
    pub(super) fn vmm_attr(&self, addr: u64) -> Option<String> {
        self.vmm
            .range_of(addr)
            .map(|(start, _)| format!("vmm_range:0x{start:016x}"))
    }
}
