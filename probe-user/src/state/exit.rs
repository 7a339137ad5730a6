//! What a process holds when it ends, told apart the way its framework means it: tensors
//! that leaked (pool blocks that outlived their step, or were still live at the end), driver
//! blocks that no pool owns (leaked driver memory), and the segments the pools keep on
//! purpose (reserved, cached: no leak).

use super::{Block, BlockKind, PoolTotals, ProcessState};
use crate::events::pools::{PoolKind, RegionChange};

/// A pool block reported as leaked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorLeak {
    pub block: Block,
    /// The last step end it was seen live at (it outlived the step it was allocated in), if
    /// any; `live_at_end` says whether it was still live when the process ended.
    pub outlived_to_step: Option<u32>,
    pub live_at_end: bool,
}

impl TensorLeak {
    /// Why it is a leak, in words: `when` is the end it was live at ("at exit", "at the end").
    pub fn why(&self, when: &str) -> String {
        match (self.outlived_to_step, self.live_at_end) {
            (Some(s), true) => format!("still live after step {s} and {when}"),
            (Some(s), false) => format!("still live after step {s}"),
            (None, _) => format!("live {when}"),
        }
    }
}

/// What one pool held on one device at the end: its driver segments and its own figures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolHeld {
    pub pool: Option<PoolKind>,
    pub device: u32,
    /// Driver blocks the pool put regions in, still live (the pool's segments).
    pub segments: u64,
    pub segment_bytes: u64,
    /// Its blocks still live.
    pub live_blocks: u64,
    pub live_bytes: u64,
    /// The pool's own last report (`memory_allocated()` / `memory_reserved()` for torch).
    pub reported: Option<PoolTotals>,
    /// The pool's segments were seen allocated (so the live ones are all it holds; else,
    /// attached late, its own figures say what it reserved).
    pub segments_known: bool,
}

impl PoolHeld {
    /// The pool as its owner label names it (`PTA`, `PTA_WORKSPACE`, `ATB`, `MINDSPORE`).
    pub fn pool_name(&self) -> &'static str {
        match self.pool {
            Some(PoolKind::PtaWorkspace) => "PTA_WORKSPACE",
            Some(p) => p.event_type(),
            None => "?",
        }
    }

    /// Reserved but not handed out: what the pool keeps cached for reuse.
    pub fn cached_bytes(&self) -> u64 {
        let reserved = match self.reported {
            Some(r) if !self.segments_known => r.reserved.max(self.segment_bytes),
            _ => self.segment_bytes,
        };
        reserved.saturating_sub(self.live_bytes)
    }
}

/// The memory of a process at its end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExitMemory {
    /// Driver blocks and handles still live that no pool owns, in allocation order.
    pub driver_leaks: Vec<Block>,
    /// Pool blocks that leaked, in allocation order.
    pub tensor_leaks: Vec<TensorLeak>,
    /// What each pool held (not leaks), by pool and device.
    pub pools: Vec<PoolHeld>,
}

impl ExitMemory {
    pub fn driver_bytes(&self) -> u64 {
        self.driver_leaks.iter().map(|b| b.size).sum()
    }

    pub fn tensor_bytes(&self) -> u64 {
        self.tensor_leaks.iter().map(|t| t.block.size).sum()
    }

    pub fn cached_bytes(&self) -> u64 {
        self.pools.iter().map(PoolHeld::cached_bytes).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.driver_leaks.is_empty() && self.tensor_leaks.is_empty() && self.pools.is_empty()
    }
}

/// Driver blocks (start, end) a framework pool put regions in: the pool's segments, which it
/// keeps on purpose. Sorted by start; regions land in few segments, so a lookup is a binary
/// search and a new segment is found once.
#[derive(Clone, Debug, Default)]
pub struct PoolSegments(Vec<(u64, u64, PoolKind)>, Vec<PoolKind>);

impl PoolSegments {
    /// A region of `pool` at `addr`: unless a known segment holds it, `containing` finds the
    /// live driver block (start, size) that does.
    pub fn note(
        &mut self,
        pool: PoolKind,
        addr: u64,
        containing: impl FnOnce() -> Option<(u64, u64)>,
    ) {
        let at = self.0.partition_point(|s| s.0 <= addr);
        if at > 0 && addr < self.0[at - 1].1 {
            return;
        }
        let Some((start, size)) = containing() else {
            return;
        };
        let at = self.0.partition_point(|s| s.0 < start);
        self.0.insert(at, (start, start + size, pool));
        if !self.1.contains(&pool) {
            self.1.push(pool);
        }
    }

    /// Whether a segment of `pool` was ever seen (then its live segments are all it holds).
    pub fn seen(&self, pool: PoolKind) -> bool {
        self.1.contains(&pool)
    }

    /// The driver block at `addr` was freed.
    pub fn forget(&mut self, addr: u64) {
        if self.0.is_empty() {
            return;
        }
        if let Ok(at) = self.0.binary_search_by_key(&addr, |s| s.0) {
            self.0.remove(at);
        }
    }

    /// The pool whose segment starts at `addr`, if any.
    pub fn owner(&self, addr: u64) -> Option<PoolKind> {
        self.0
            .binary_search_by_key(&addr, |s| s.0)
            .ok()
            .map(|at| self.0[at].2)
    }
}

impl ProcessState {
    /// A pool put a region at `addr`: the driver block holding it is the pool's segment.
    /// Regions land in few segments, so the sorted list answers most calls; a new segment
    /// costs one pass over the live driver blocks.
    pub(super) fn note_pool_segment(&mut self, pool: PoolKind, addr: u64, size: u64) {
        if self.note_mapped_segments(pool, addr, size) {
            return;
        }
        let live = &self.live;
        // Built at the first region, then kept by `insert_block` and `forget_pool_segment`: a
        // region outside every segment (a pool on memory the driver API did not give, or
        // given before an attach) costs a lookup, not a pass over the live blocks.
        let index = self.device_index.get_or_insert_with(|| {
            live.values()
                .filter(|b| b.kind == BlockKind::Device)
                .map(|b| (b.addr, b.size))
                .collect()
        });
        self.pool_segments.note(pool, addr, || {
            let (start, size) = index.range(..=addr).next_back()?;
            (addr < start + size).then_some((*start, *size))
        });
    }

    /// Whether a live driver block is a framework pool's segment (kept on purpose: never a
    /// leak suspect).
    pub fn is_pool_segment(&self, b: &Block) -> bool {
        matches!(b.kind, BlockKind::Device | BlockKind::Handle)
            && self.pool_segments.owner(b.addr).is_some()
    }

    /// A driver block at `addr` was freed: it is no pool's segment any more.
    pub(super) fn forget_pool_segment(&mut self, addr: u64) {
        if let Some(index) = &mut self.device_index {
            index.remove(&addr);
        }
        self.pool_segments.forget(addr);
    }

    pub(super) fn note_pool_totals(&mut self, c: RegionChange) {
        let t = PoolTotals {
            pool: Some(c.pool),
            device: c.device,
            allocated: c.allocated,
            reserved: c.reserved,
        };
        PoolTotals::record(&mut self.pool_totals, t);
    }

    /// The process's memory now, as its end report tells it.
    pub fn exit_memory(&self) -> ExitMemory {
        let mut live_pool: Vec<Block> = self.pool_blocks.values().cloned().collect();
        live_pool.sort_by_key(|b| b.allocation_id);
        ExitMemory::classify(
            self.live_blocks(),
            &self.pool_segments,
            live_pool,
            &self.pool_totals,
            self.step_leak_blocks
                .values()
                .map(|(b, step)| (b.clone(), *step)),
        )
    }
}

impl ExitMemory {
    /// Sorts a process's end state into leaks and what the pools hold (online from the
    /// process state, offline from a dump's rows: one rule). `live_driver` and `live_pool`
    /// in allocation order; `outlived`: pool blocks the step analysis found, with the last
    /// step end each outlived.
    pub fn classify(
        live_driver: Vec<Block>,
        segments: &PoolSegments,
        live_pool: Vec<Block>,
        totals: &[PoolTotals],
        outlived: impl Iterator<Item = (Block, u32)>,
    ) -> ExitMemory {
        let mut out = ExitMemory::default();
        let mut held: Vec<PoolHeld> = Vec::new();
        for b in live_driver {
            let owner = matches!(b.kind, BlockKind::Device | BlockKind::Handle)
                .then(|| segments.owner(b.addr))
                .flatten();
            match owner {
                Some(pool) => {
                    let i = held_entry(&mut held, pool, b.device);
                    held[i].segments += 1;
                    held[i].segment_bytes += b.size;
                }
                None => out.driver_leaks.push(b),
            }
        }
        for b in &live_pool {
            if let BlockKind::Pool(pool) = b.kind {
                let i = held_entry(&mut held, pool, b.device);
                held[i].live_blocks += 1;
                held[i].live_bytes += b.size;
            }
        }
        for t in totals {
            if let Some(pool) = t.pool {
                let i = held_entry(&mut held, pool, t.device);
                held[i].reported = Some(*t);
            }
        }
        // Leaked tensors: those that outlived a later step, and those live at the end. Keyed
        // by allocation order (allocation id, then time).
        let key = |b: &Block| (b.allocation_id, b.ts_ns, b.addr);
        let mut leaks: std::collections::BTreeMap<(u64, u64, u64), TensorLeak> = outlived
            .map(|(b, step)| {
                (
                    key(&b),
                    TensorLeak {
                        block: b,
                        outlived_to_step: Some(step),
                        live_at_end: false,
                    },
                )
            })
            .collect();
        // A workspace pool's block is its cache, not a tensor.
        for b in live_pool
            .into_iter()
            .filter(|b| matches!(b.kind, BlockKind::Pool(p) if p.analysed()))
        {
            leaks
                .entry(key(&b))
                .or_insert_with(|| TensorLeak {
                    block: b,
                    outlived_to_step: None,
                    live_at_end: true,
                })
                .live_at_end = true;
        }
        out.tensor_leaks = leaks.into_values().collect();
        for h in &mut held {
            h.segments_known = h.pool.is_some_and(|p| segments.seen(p));
        }
        held.retain(|h| h.segments > 0 || h.live_blocks > 0 || h.reported.is_some());
        held.sort_by_key(|h| (h.device, h.pool.map(|p| p.event_type())));
        out.pools = held;
        out
    }
}

fn held_entry(held: &mut Vec<PoolHeld>, pool: PoolKind, device: u32) -> usize {
    match held
        .iter()
        .position(|h| h.pool == Some(pool) && h.device == device)
    {
        Some(i) => i,
        None => {
            held.push(PoolHeld {
                pool: Some(pool),
                device,
                ..Default::default()
            });
            held.len() - 1
        }
    }
}
