//! MindSpore's device memory pool seen from outside (no mstx, no injection): the calls of its
//! exported `AbstractDynamicMemPool::AllocTensorMem` / `DoFreeTensorMem` become the pool's
//! block changes, as the mstx regions of its enhanced pool wrapper would (`pools.rs`).
//!
//! The pool's `used` is the bytes of its blocks live now, as the tracer saw them made: the sizes
//! the pool itself passes (already aligned to its block size), so in a process traced from its
//! start it is `mindspore.runtime.memory_allocated()`; a process attached to (`--pid`) counts
//! the blocks made after the attach. `total` is left to the caller (the driver memory the
//! process holds on that device).

use std::collections::HashMap;

use crate::events::pools::{PoolKind, RegionChange};

#[derive(Debug, Default)]
pub struct MindSporePools {
    /// Live blocks by address: (device, size).
    live: HashMap<u64, (u32, u64)>,
    used: HashMap<u32, u64>,
    /// Frees of blocks made before tracing began, or that the pool refused.
    pub unmatched: u64,
}

impl MindSporePools {
    /// A block handed out on `device` (`addr` 0: the pool failed, nothing changes).
    pub fn alloc(&mut self, device: u32, addr: u64, size: u64) -> Option<RegionChange> {
        if addr == 0 {
            return None;
        }
        if let Some((old_device, old_size)) = self.live.insert(addr, (device, size)) {
            // Its free was missed: the address cannot be live twice.
            let old = self.used.entry(old_device).or_default();
            *old = old.saturating_sub(old_size);
        }
        let used = self.used.entry(device).or_default();
        *used += size;
        let used = *used;
        Some(RegionChange {
            pool: PoolKind::MindSpore,
            device,
            addr,
            size,
            allocated: used,
            reserved: 0,
        })
    }

    /// The pool freed the block at `addr` (`freed`: it said so; a refused free changes nothing).
    pub fn free(&mut self, addr: u64, freed: bool) -> Option<RegionChange> {
        let Some((device, size)) = freed.then(|| self.live.remove(&addr)).flatten() else {
            self.unmatched += 1;
            return None;
        };
        let used = self.used.entry(device).or_default();
        *used = used.saturating_sub(size);
        Some(RegionChange {
            pool: PoolKind::MindSpore,
            device,
            addr,
            size,
            allocated: *used,
            reserved: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn used_follows_the_blocks_and_refused_frees_change_nothing() {
        let mut p = MindSporePools::default();
        assert_eq!(p.alloc(0, 0, 512), None, "a failed allocation");
        let a = p.alloc(0, 0x6000_0000_0200, 1_049_088).unwrap();
        let b = p.alloc(0, 0x6000_0010_0400, 25_166_336).unwrap();
        assert_eq!((a.allocated, b.allocated), (1_049_088, 26_215_424));
        assert_eq!(b.pool.event_type(), "MINDSPORE");
        assert_eq!(p.free(0x6000_0000_0200, false), None, "refused");
        assert_eq!(p.unmatched, 1);
        let f = p.free(0x6000_0000_0200, true).unwrap();
        assert_eq!((f.size, f.allocated), (1_049_088, 25_166_336));
        assert_eq!(p.free(0x6000_0000_0200, true), None, "freed twice");
        // A block on device 1 has its own total; an address made again closes the old one.
        assert_eq!(p.alloc(1, 0x10, 100).unwrap().allocated, 100);
        assert_eq!(p.alloc(0, 0x10, 50).unwrap().allocated, 25_166_386);
        assert_eq!(p.free(0x10, true).unwrap().device, 0);
    }
}
