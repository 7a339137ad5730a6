//! Framework memory pools reported through the mstx memory API (spec §1.6): torch_npu's
//! caching allocator and workspace, MindSpore's pool, ATB. Domains name the pool; heaps are the
//! segments a pool reserves; regions are its sub-allocations (one MALLOC/FREE row each).

use std::collections::HashMap;

use crate::events::decode::{RegionDesc, RegionRef};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PoolKind {
    PtaCaching,
    PtaWorkspace,
    MindSpore,
    Atb,
}

impl PoolKind {
    /// The pool a domain name stands for (`msleaks` is the legacy name of `ptaCaching`).
    pub fn from_domain(name: &str) -> Option<Self> {
        match name {
            "ptaCaching" | "msleaks" => Some(PoolKind::PtaCaching),
            "ptaWorkspace" => Some(PoolKind::PtaWorkspace),
            "mindsporeMemPool" => Some(PoolKind::MindSpore),
            "atb" => Some(PoolKind::Atb),
            _ => None,
        }
    }

    /// The "Event Type" column (the workspace pool writes `PTA` too, as msMemScope does).
    pub fn event_type(self) -> &'static str {
        match self {
            PoolKind::PtaCaching | PoolKind::PtaWorkspace => "PTA",
            PoolKind::MindSpore => "MINDSPORE",
            PoolKind::Atb => "ATB",
        }
    }

    /// The name the leak and gap reports use.
    pub fn display_name(self) -> &'static str {
        match self {
            PoolKind::PtaCaching => "Pytorch Caching memory pool",
            PoolKind::PtaWorkspace => "Pytorch Workspace memory pool",
            PoolKind::MindSpore => "Mindspore memory pool",
            PoolKind::Atb => "ATB memory pool",
        }
    }

    /// The step-leak and gap analyses cover every pool but the workspace.
    pub fn analysed(self) -> bool {
        self != PoolKind::PtaWorkspace
    }
}

/// A region that became live or was freed, with the pool totals after the change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionChange {
    pub pool: PoolKind,
    pub device: u32,
    pub addr: u64,
    pub size: u64,
    /// Bytes handed out by the pool on this device (`used`).
    pub allocated: u64,
    /// Bytes the pool reserved on this device (`total`).
    pub reserved: u64,
}

#[derive(Debug, Default)]
struct Pool {
    reserved: HashMap<u32, u64>,
    allocated: HashMap<u32, u64>,
    /// Heap handle (and heap base address) -> its range.
    heaps: HashMap<u64, RegionDesc>,
    /// Live regions by address.
    regions: HashMap<u64, RegionDesc>,
    /// Region handle -> address (pools that free by handle, like ATB).
    handles: HashMap<u64, u64>,
}

/// The pool state of one process.
#[derive(Debug, Default)]
pub struct Pools {
    domains: HashMap<u64, PoolKind>,
    pools: HashMap<PoolKind, Pool>,
    /// Regions freed that no pool knew (allocated before tracing started).
    pub unmatched: u64,
    /// Calls on a domain that is not one of the known pools.
    pub unknown_domain: u64,
}

impl Pools {
    pub fn domain_created(&mut self, name: &str, handle: u64) {
        if let Some(kind) = PoolKind::from_domain(name) {
            self.domains.insert(handle, kind);
        }
    }

    fn pool(&mut self, domain: u64) -> Option<(PoolKind, &mut Pool)> {
        match self.domains.get(&domain) {
            Some(kind) => Some((*kind, self.pools.entry(*kind).or_default())),
            None => {
                self.unknown_domain += 1;
                None
            }
        }
    }

    pub fn heap_registered(&mut self, domain: u64, heap: u64, range: RegionDesc) {
        let Some((kind, pool)) = self.pool(domain) else {
            return;
        };
        let reserved = pool.reserved.entry(range.device).or_default();
        // ATB adds up its heaps; the other pools report their whole reservation each time.
        if kind == PoolKind::Atb {
            *reserved += range.size;
        } else {
            *reserved = range.size;
        }
        pool.heaps.insert(range.ptr, range);
        if heap != 0 {
            pool.heaps.insert(heap, range);
        }
    }

    pub fn heap_unregistered(&mut self, domain: u64, heap: u64) {
        let Some((_, pool)) = self.pool(domain) else {
            return;
        };
        if let Some(range) = pool.heaps.remove(&heap) {
            pool.heaps.remove(&range.ptr);
            let reserved = pool.reserved.entry(range.device).or_default();
            *reserved = reserved.saturating_sub(range.size);
        }
    }

    /// Registers regions; returns the ones that became live (ATB ignores regions on a device
    /// without a heap, as msMemScope does).
    pub fn regions_registered(&mut self, domain: u64, regions: &[RegionDesc]) -> Vec<RegionChange> {
        let Some((kind, pool)) = self.pool(domain) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for r in regions {
            if kind == PoolKind::Atb && !pool.heaps.values().any(|h| h.device == r.device) {
                continue;
            }
            let allocated = pool.allocated.entry(r.device).or_default();
            // The workspace pool reports its current size, not a sum.
            if kind == PoolKind::PtaWorkspace {
                *allocated = r.size;
            } else {
                *allocated += r.size;
            }
            let allocated = *allocated;
            pool.regions.insert(r.ptr, *r);
            if r.handle != 0 {
                pool.handles.insert(r.handle, r.ptr);
            }
            out.push(RegionChange {
                pool: kind,
                device: r.device,
                addr: r.ptr,
                size: r.size,
                allocated,
                reserved: pool.reserved.get(&r.device).copied().unwrap_or(0),
            });
        }
        out
    }

    pub fn regions_unregistered(&mut self, domain: u64, refs: &[RegionRef]) -> Vec<RegionChange> {
        let Some((kind, pool)) = self.pool(domain) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut unmatched = 0;
        for r in refs {
            let addr = match r {
                RegionRef::Pointer(p) => Some(*p),
                RegionRef::Handle(h) => pool.handles.remove(h),
            };
            let Some(region) = addr.and_then(|a| pool.regions.remove(&a)) else {
                unmatched += 1;
                continue;
            };
            if region.handle != 0 {
                pool.handles.remove(&region.handle);
            }
            let allocated = pool.allocated.entry(region.device).or_default();
            *allocated = allocated.saturating_sub(region.size);
            out.push(RegionChange {
                pool: kind,
                device: region.device,
                addr: region.ptr,
                size: region.size,
                allocated: *allocated,
                reserved: pool.reserved.get(&region.device).copied().unwrap_or(0),
            });
        }
        self.unmatched += unmatched;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(device: u32, ptr: u64, size: u64, handle: u64) -> RegionDesc {
        RegionDesc {
            device,
            ptr,
            size,
            handle,
        }
    }

    #[test]
    fn caching_pool_accounting() {
        let mut p = Pools::default();
        p.domain_created("msleaks", 0x10);
        p.domain_created("somethingElse", 0x20);
        p.heap_registered(0x10, 0, region(1, 0x1000_0000, 1 << 26, 0));
        p.heap_registered(0x10, 0, region(1, 0x2000_0000, 1 << 27, 0));
        let c = p.regions_registered(
            0x10,
            &[
                region(1, 0x1000_0000, 100, 0),
                region(1, 0x1000_1000, 50, 0),
            ],
        );
        assert_eq!(c.len(), 2);
        assert_eq!(
            (c[1].allocated, c[1].reserved),
            (150, 1 << 27),
            "reservation overwritten, not added"
        );
        assert_eq!(c[0].pool.event_type(), "PTA");
        let f = p.regions_unregistered(
            0x10,
            &[RegionRef::Pointer(0x1000_0000), RegionRef::Pointer(0xdead)],
        );
        assert_eq!(f.len(), 1);
        assert_eq!((f[0].size, f[0].allocated), (100, 50));
        assert_eq!(p.unmatched, 1);
        assert!(p.regions_registered(0x20, &[region(0, 1, 1, 0)]).is_empty());
        assert_eq!(p.unknown_domain, 1);
        p.heap_unregistered(0x10, 0x2000_0000);
        let c = p.regions_registered(0x10, &[region(1, 0x3000, 10, 0)]);
        assert_eq!(c[0].reserved, 0);
    }

    #[test]
    fn atb_frees_by_handle_and_needs_a_heap() {
        let mut p = Pools::default();
        p.domain_created("atb", 0x30);
        assert!(
            p.regions_registered(0x30, &[region(0, 0x100, 8, 0x77)])
                .is_empty(),
            "no heap yet"
        );
        p.heap_registered(0x30, 0xaaa, region(0, 0x100, 1000, 0));
        p.heap_registered(0x30, 0xbbb, region(0, 0x9000, 500, 0));
        let c = p.regions_registered(0x30, &[region(0, 0x100, 8, 0x77)]);
        assert_eq!(
            (c[0].allocated, c[0].reserved, c[0].pool),
            (8, 1500, PoolKind::Atb)
        );
        let f = p.regions_unregistered(0x30, &[RegionRef::Handle(0x77)]);
        assert_eq!((f[0].addr, f[0].allocated), (0x100, 0));
        assert!(
            p.regions_unregistered(0x30, &[RegionRef::Handle(0x77)])
                .is_empty()
        );
    }

    #[test]
    fn workspace_reports_current_size() {
        let mut p = Pools::default();
        p.domain_created("ptaWorkspace", 1);
        p.regions_registered(1, &[region(0, 0x10, 64, 0)]);
        let c = p.regions_registered(1, &[region(0, 0x20, 32, 0)]);
        assert_eq!(c[0].allocated, 32);
        assert_eq!(c[0].pool.event_type(), "PTA");
        assert!(!c[0].pool.analysed());
    }
}
