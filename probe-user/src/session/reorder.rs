//! The reorder window's queue: events held in (timestamp, arrival) order. Only small keys
//! move; each event stays in its slot until it is taken out. The keys wait in buckets of
//! ~1 ms of timestamps, and a bucket is sorted once when its turn comes (the events arrive
//! almost in order, so that sort is close to linear). A binary heap of whole events moved a
//! few hundred bytes per level at every push and pop, and a heap of keys still took ~9% of
//! the node agent's CPU at 10^5 calls/s (~5000 events in a 50 ms window).
//!
//! The slots are a ring in arrival order, so events are written and read back nearly
//! sequentially. Reused free slots (a stack of them) scattered those accesses, and on a
//! busy machine, whose other processes empty the caches between two drains, nearly every
//! push and peek missed the cache: ~20% of the agent's CPU.

use std::collections::{BTreeMap, VecDeque};

/// An event with its place in the order: `ts`, then `seq` (arrival) for equal timestamps.
pub(super) trait Ordered {
    fn key(&self) -> (u64, u64);
}

/// Timestamps per bucket: 2^20 ns, ~1 ms.
const BUCKET_SHIFT: u32 = 20;

/// (ts, seq, slot): `slot` is the event's arrival number.
type Key = (u64, u64, u64);

pub(super) struct Reorder<T> {
    /// The earliest bucket taken out of `later`, sorted, smallest key last.
    front: Vec<Key>,
    /// The bucket number of `front` (None: `front` is not a bucket yet).
    front_bucket: Option<u64>,
    /// The other buckets, keys unsorted: (ts, seq, slot).
    later: BTreeMap<u64, Vec<Key>>,
    /// Emptied bucket vectors, kept for their allocation.
    spare: Vec<Vec<Key>>,
    /// The events by arrival, from arrival number `first_slot` on; taken ones are None until
    /// every earlier one is taken too.
    slots: VecDeque<Option<T>>,
    first_slot: u64,
}

impl<T: Ordered> Reorder<T> {
    pub(super) fn new() -> Self {
        Reorder {
            front: Vec::new(),
            front_bucket: None,
            later: BTreeMap::new(),
            spare: Vec::new(),
            slots: VecDeque::new(),
            first_slot: 0,
        }
    }

    pub(super) fn push(&mut self, item: T) {
        let (ts, seq) = item.key();
        let slot = self.first_slot + self.slots.len() as u64;
        self.slots.push_back(Some(item));
        let key = (ts, seq, slot);
        let bucket = ts >> BUCKET_SHIFT;
        match self.front_bucket {
            // Late for the bucket being taken out (or earlier still): into its place there.
            Some(f) if bucket <= f => {
                let at = self.front.partition_point(|k| *k > key);
                self.front.insert(at, key);
            }
            _ => {
                let spare = &mut self.spare;
                self.later
                    .entry(bucket)
                    .or_insert_with(|| spare.pop().unwrap_or_default())
                    .push(key)
            }
        }
    }

    /// The smallest key, with `front` refilled from the next bucket when it ran out.
    fn first(&mut self) -> Option<Key> {
        if self.front.is_empty() {
            self.front_bucket = None;
            let (bucket, mut keys) = self.later.pop_first()?;
            keys.sort_unstable_by(|a, b| b.cmp(a));
            let old = std::mem::replace(&mut self.front, keys);
            self.spare.push(old);
            self.front_bucket = Some(bucket);
        }
        self.front.last().copied()
    }

    /// The first event, to complete in place (its key must not change).
    pub(super) fn peek_mut(&mut self) -> Option<&mut T> {
        let (_, _, slot) = self.first()?;
        self.slots[(slot - self.first_slot) as usize].as_mut()
    }

    /// The key of the first event (its timestamp, without touching the event).
    pub(super) fn first_key(&mut self) -> Option<(u64, u64)> {
        self.first().map(|(ts, seq, _)| (ts, seq))
    }

    pub(super) fn pop(&mut self) -> Option<T> {
        self.first()?;
        let (_, _, slot) = self.front.pop()?;
        let item = self.slots[(slot - self.first_slot) as usize].take();
        while let Some(None) = self.slots.front() {
            self.slots.pop_front();
            self.first_slot += 1;
        }
        item
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Ev(u64, u64, &'static str);
    impl Ordered for Ev {
        fn key(&self) -> (u64, u64) {
            (self.0, self.1)
        }
    }

    #[test]
    fn events_come_out_by_time_then_arrival_and_slots_go_from_the_front() {
        let mut q = Reorder::new();
        q.push(Ev(30, 1, "c"));
        q.push(Ev(10, 2, "a"));
        q.push(Ev(30, 0, "b"));
        assert_eq!(q.peek_mut().map(|e| e.2), Some("a"));
        q.peek_mut().unwrap().2 = "a2";
        let mut out = vec![q.pop().unwrap().2];
        // A late arrival dated before the rest still comes out first.
        q.push(Ev(5, 3, "early"));
        assert_eq!(q.slots.len(), 4, "slots go only from the front");
        out.push(q.pop().unwrap().2);
        assert_eq!(q.first_key(), Some((30, 0)));
        out.push(q.pop().unwrap().2);
        assert_eq!(
            q.slots.len(),
            4,
            "c, the first to arrive, holds the slots after it"
        );
        while let Some(e) = q.pop() {
            out.push(e.2);
        }
        assert_eq!(out, ["a2", "early", "b", "c"]);
        assert!(q.first_key().is_none());
        assert!(q.slots.is_empty(), "all slots given back");
        assert_eq!(q.first_slot, 4);
    }

    /// Against a binary heap (the queue this replaced), on streams arriving nearly in order
    /// with late stragglers, across bucket boundaries, popped while still being filled.
    #[test]
    fn same_order_as_a_heap_of_the_same_events() {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        struct K(u64, u64);
        impl Ordered for K {
            fn key(&self) -> (u64, u64) {
                (self.0, self.1)
            }
        }
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut q = Reorder::new();
        let mut heap = BinaryHeap::new();
        let mut now = 5u64 << 30;
        let (mut from_q, mut from_heap) = (Vec::new(), Vec::new());
        for seq in 0..200_000u64 {
            now += next() % 20_000;
            let late = match next() % 16 {
                0 => next() % (30 << 20),
                1..=3 => next() % 50_000,
                _ => 0,
            };
            // Equal timestamps happen (several calls in one clock tick).
            let ts = if next() % 8 == 0 { now } else { now - late };
            q.push(K(ts, seq));
            heap.push(Reverse((ts, seq)));
            // Release what is older than a window, as the session does.
            let horizon = now.saturating_sub(50 << 20);
            while q.first_key().is_some_and(|k| k.0 <= horizon) {
                let k = q.pop().unwrap();
                from_q.push((k.0, k.1));
                from_heap.push(heap.pop().unwrap().0);
            }
        }
        while let Some(k) = q.pop() {
            from_q.push((k.0, k.1));
        }
        from_heap.extend(std::iter::from_fn(|| heap.pop().map(|r| r.0)));
        assert_eq!(from_q.len(), 200_000);
        assert_eq!(from_q, from_heap);
    }
}
