//! What is live during a replay: driver blocks by process and address (the one with the
//! row's allocation id when it has one), pool regions apart.

use super::{Event, LiveBlock, TrackKey};
use crate::output::DeviceKey;
use std::collections::{BTreeMap, HashMap};

/// Key of a live block: process and address (blocks at one address are kept newest last).
pub(super) type LiveKey = (u32, u64);

/// Live blocks during a replay.
#[derive(Default)]
pub(super) struct LiveSet {
    driver: HashMap<LiveKey, Vec<(LiveBlock, DeviceKey)>>,
    pool: HashMap<(u32, u32, u64), Vec<(LiveBlock, DeviceKey)>>,
    steps: HashMap<u32, u32>,
}

impl LiveSet {
    pub(super) fn step(&mut self, pid: u32) {
        *self.steps.entry(pid).or_default() += 1;
    }

    pub(super) fn insert(&mut self, e: &Event, driver: bool) {
        let b = LiveBlock {
            addr: e.addr,
            size: e.size,
            alloc_id: e.alloc_id,
            ts: e.ts,
            tid: e.tid,
            owner: e.name,
            stack: e.stack,
            step: self.steps.get(&e.pid).copied().unwrap_or(0),
        };
        if driver {
            self.driver
                .entry((e.pid, e.addr))
                .or_default()
                .push((b, e.device));
        } else {
            self.pool
                .entry((e.pid, e.pool, e.addr))
                .or_default()
                .push((b, e.device));
        }
    }

    /// Closes the block a FREE names; returns it and its device.
    pub(super) fn remove(&mut self, e: &Event, driver: bool) -> Option<(LiveBlock, DeviceKey)> {
        fn take<K: std::hash::Hash + Eq>(
            map: &mut HashMap<K, Vec<(LiveBlock, DeviceKey)>>,
            key: K,
            alloc_id: u64,
        ) -> Option<(LiveBlock, DeviceKey)> {
            let blocks = map.get_mut(&key)?;
            let pos = if alloc_id != 0 {
                blocks
                    .iter()
                    .rposition(|(b, _)| b.alloc_id == alloc_id || b.alloc_id == 0)
            } else {
                blocks.len().checked_sub(1)
            }?;
            let b = blocks.remove(pos);
            // Addresses are rarely reused in long runs: keep the map to the live blocks.
            if blocks.is_empty() {
                map.remove(&key);
            }
            Some(b)
        }
        if driver {
            take(&mut self.driver, (e.pid, e.addr), e.alloc_id)
        } else {
            take(&mut self.pool, (e.pid, e.pool, e.addr), e.alloc_id)
        }
    }

    /// The live blocks per track: the pool blocks of the tracks in `pool_tracks`, the driver
    /// blocks of the others.
    pub(super) fn by_track(
        &self,
        pool_tracks: &std::collections::HashSet<TrackKey>,
    ) -> BTreeMap<TrackKey, Vec<LiveBlock>> {
        let mut m: BTreeMap<TrackKey, Vec<LiveBlock>> = BTreeMap::new();
        let driver = self.driver.iter().map(|((pid, _), v)| (pid, v, false));
        let pool = self.pool.iter().map(|((pid, _, _), v)| (pid, v, true));
        for (pid, v, from_pool) in driver.chain(pool) {
            for (b, d) in v {
                let key = TrackKey {
                    pid: *pid,
                    device: *d,
                };
                if pool_tracks.contains(&key) == from_pool {
                    m.entry(key).or_default().push(b.clone());
                }
            }
        }
        for v in m.values_mut() {
            v.sort_by_key(|b| (b.ts, b.alloc_id, b.addr));
        }
        m
    }

    pub(super) fn drain_driver(&mut self) -> Vec<(u32, DeviceKey, LiveBlock)> {
        let mut out = Vec::new();
        for ((pid, _), v) in self.driver.drain() {
            for (b, d) in v {
                out.push((pid, d, b));
            }
        }
        out
    }
}
