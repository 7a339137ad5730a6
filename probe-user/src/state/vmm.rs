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

    /// The handle mapped at `addr`.
    pub(super) fn handle_at(&self, addr: u64) -> Option<u64> {
        let (start, (size, handle)) = self.mapped.range(..=addr).next_back()?;
        (addr < start + size).then_some(*handle)
    }
}

impl ProcessState {
    pub(super) fn vmm_reserved(&mut self, addr: u64, size: u64) {
        self.vmm.reserved.insert(addr, size);
    }

    pub(super) fn vmm_released(&mut self, addr: u64) {
        self.vmm.reserved.remove(&addr);
    }

    /// A handle mapped at `addr`: it becomes the segment of a pool with blocks there already
    /// (a pool may map the memory behind a block after handing the block out).
    pub(super) fn vmm_mapped(&mut self, addr: u64, size: u64, handle: u64) {
        self.vmm.mapped.insert(addr, (size, handle));
        let end = addr.saturating_add(size);
        let pool = self
            .pool_blocks
            .keys()
            .find(|(_, a)| (addr..end).contains(a))
            .map(|(pool, _)| *pool);
        if let Some(pool) = pool {
            self.note_handle_segment(pool, handle);
        }
    }

    pub(super) fn vmm_unmapped(&mut self, addr: u64) {
        self.vmm.mapped.remove(&addr);
    }

    /// For a pool block at `addr`: the handle mapped behind it is the pool's segment. Returns
    /// false when no mapping holds `addr` (then the block may lie in a `halMemAlloc` block).
    pub(super) fn note_mapped_segment(&mut self, pool: PoolKind, addr: u64) -> bool {
        match self.vmm.handle_at(addr) {
            Some(handle) => {
                self.note_handle_segment(pool, handle);
                true
            }
            None => false,
        }
    }

    fn note_handle_segment(&mut self, pool: PoolKind, handle: u64) {
        let Some(b) = self.live_handles.get(&handle) else {
            return;
        };
        debug_assert_eq!(b.kind, BlockKind::Handle);
        let (start, size) = (b.addr, b.size);
        self.pool_segments
            .note(pool, handle, || Some((start, size.max(1))));
    }

    /// `vmm_range:0xSTART` of the reserved range a pool block lies in, for its row.
    pub(super) fn vmm_attr(&self, addr: u64) -> Option<String> {
        self.vmm
            .range_of(addr)
            .map(|(start, _)| format!("vmm_range:0x{start:016x}"))
    }
}
