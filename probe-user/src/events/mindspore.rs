//! MindSpore's device memory pool seen from outside (no mstx, no injection): the calls of its
//! exported `AbstractDynamicMemPool::AllocTensorMem` / `DoFreeTensorMem` become the pool's
//! block changes, as the mstx regions of its enhanced pool wrapper would (`pools.rs`).
//!
//! The pool's `used` is the bytes of its blocks live now, as the tracer saw them made: the sizes
//! the pool itself passes (already aligned to its block size), so in a process traced from its
//! start it is `mindspore.runtime.memory_allocated()`. In a process attached to (`--pid`) the
//! blocks made before the attach are unseen: when the probes could read the pool's own used
//! bytes (`trace/mindspore.rs`), the first call seen, and each free of an unseen block, set
//! what the unseen blocks add (the pool's count less the seen blocks), so `used` is
//! `memory_allocated()` there too; without it, `used` counts the blocks made since the attach.
//! `total` is left to the caller (the driver memory the process holds on that device).

use std::collections::HashMap;

use crate::events::pools::{PoolKind, RegionChange};

#[derive(Debug, Default)]
pub struct MindSporePools {
    /// Live blocks by address: (device, size).
    live: HashMap<u64, (u32, u64)>,
    used: HashMap<u32, u64>,
    /// Bytes of the pool's blocks on a device made before tracing began, as its own count
    /// told at the first call seen (or at the last free of such a block).
    unseen: HashMap<u32, u64>,
    /// Frees of blocks made before tracing began, or that the pool refused.
    pub unmatched: u64,
}

impl MindSporePools {
    /// The pool's `used` on `device`: the seen blocks, and the unseen ones once the pool's own
    /// count (`pool_used`, after the call) told them; `rebase` sets them again.
    fn used(&mut self, device: u32, pool_used: Option<u64>, rebase: bool) -> u64 {
        let seen = self.used.get(&device).copied().unwrap_or(0);
        if let Some(pool) = pool_used
            && (rebase || !self.unseen.contains_key(&device))
        {
            self.unseen.insert(device, pool.saturating_sub(seen));
        }
        seen + self.unseen.get(&device).copied().unwrap_or(0)
    }

    /// A block handed out on `device` (`addr` 0: the pool failed, nothing changes).
    /// `pool_used`: the pool's own used bytes after it, when read.
    pub fn alloc(
        &mut self,
        device: u32,
        addr: u64,
        size: u64,
        pool_used: Option<u64>,
    ) -> Option<RegionChange> {
        if addr == 0 {
            return None;
        }
        if let Some((old_device, old_size)) = self.live.insert(addr, (device, size)) {
            // Its free was missed: the address cannot be live twice.
            let old = self.used.entry(old_device).or_default();
            *old = old.saturating_sub(old_size);
        }
        *self.used.entry(device).or_default() += size;
        let used = self.used(device, pool_used, false);
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
    /// `device`: the calling thread's, for a block not seen made.
    pub fn free(
        &mut self,
        device: u32,
        addr: u64,
        freed: bool,
        pool_used: Option<u64>,
    ) -> Option<RegionChange> {
        let Some((device, size)) = freed.then(|| self.live.remove(&addr)).flatten() else {
            self.unmatched += 1;
            if freed {
                // A block made before tracing began: the pool's count says what is left.
                self.used(device, pool_used, true);
            }
            return None;
        };
        let seen = self.used.entry(device).or_default();
        *seen = seen.saturating_sub(size);
        let used = self.used(device, pool_used, false);
        Some(RegionChange {
            pool: PoolKind::MindSpore,
            device,
            addr,
            size,
            allocated: used,
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
        assert_eq!(p.alloc(0, 0, 512, None), None, "a failed allocation");
        let a = p.alloc(0, 0x6000_0000_0200, 1_049_088, None).unwrap();
        let b = p.alloc(0, 0x6000_0010_0400, 25_166_336, None).unwrap();
        assert_eq!((a.allocated, b.allocated), (1_049_088, 26_215_424));
        assert_eq!(b.pool.event_type(), "MINDSPORE");
        assert_eq!(p.free(0, 0x6000_0000_0200, false, None), None, "refused");
        assert_eq!(p.unmatched, 1);
        let f = p.free(0, 0x6000_0000_0200, true, None).unwrap();
        assert_eq!((f.size, f.allocated), (1_049_088, 25_166_336));
        assert_eq!(p.free(0, 0x6000_0000_0200, true, None), None, "freed twice");
        // A block on device 1 has its own total; an address made again closes the old one.
        assert_eq!(p.alloc(1, 0x10, 100, None).unwrap().allocated, 100);
        assert_eq!(p.alloc(0, 0x10, 50, None).unwrap().allocated, 25_166_386);
        assert_eq!(p.free(0, 0x10, true, None).unwrap().device, 0);
    }

    #[test]
    fn blocks_made_before_the_attach_count_once_the_pool_tells_them() {
        let mut p = MindSporePools::default();
        // Attached with 3 MiB of blocks live: the first call seen reads 3 MiB + its own.
        let mib = 1 << 20;
        let a = p.alloc(0, 0x100, mib, Some(4 * mib)).unwrap();
        assert_eq!(a.allocated, 4 * mib);
        // Later calls count from there (what the pool reads then is not needed).
        assert_eq!(p.alloc(0, 0x200, mib, None).unwrap().allocated, 5 * mib);
        assert_eq!(
            p.free(0, 0x100, true, Some(4 * mib)).unwrap().allocated,
            4 * mib
        );
        // A block made before the attach is freed: no row (its size is unknown), and the
        // pool's count says what is left of the unseen ones.
        assert_eq!(p.free(0, 0x999, true, Some(2 * mib)), None);
        assert_eq!(p.alloc(0, 0x300, mib, None).unwrap().allocated, 3 * mib);
        // A refused free of an unseen block changes nothing.
        assert_eq!(p.free(0, 0x998, false, Some(0)), None);
        assert_eq!(p.alloc(0, 0x400, mib, None).unwrap().allocated, 4 * mib);
        // Traced from the start, the pool's count is the seen blocks: nothing unseen.
        let mut q = MindSporePools::default();
        assert_eq!(q.alloc(0, 0x10, 512, Some(512)).unwrap().allocated, 512);
        assert_eq!(q.alloc(1, 0x20, 512, Some(512)).unwrap().allocated, 512);
    }
}
