//! Inefficient memory (`--analysis=inefficient`, spec §6.8) on framework pool blocks, driven by
//! operator boundaries and tensor accesses:
//!
//! * APIs are numbered: each operator (begin..end) is one API; a memory event outside an
//!   operator is an API of its own.
//! * **early_allocation**: another block was freed by an API between this block's allocating
//!   API and its first access from another API.
//! * **late_deallocation**: another block was allocated by an API between this block's last
//!   access and its free.
//! * **temporary_idleness**: more than `threshold` APIs (3000) between two accesses.

use std::collections::HashMap;

/// msMemScope's idle threshold, in APIs.
pub const IDLE_THRESHOLD: u64 = 3000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Inefficiency {
    EarlyAllocation,
    LateDeallocation,
    TemporaryIdleness,
}

impl Inefficiency {
    pub fn as_str(self) -> &'static str {
        match self {
            Inefficiency::EarlyAllocation => "early_allocation",
            Inefficiency::LateDeallocation => "late_deallocation",
            Inefficiency::TemporaryIdleness => "temporary_idleness",
        }
    }

    pub const ALL: [Inefficiency; 3] = [
        Inefficiency::EarlyAllocation,
        Inefficiency::LateDeallocation,
        Inefficiency::TemporaryIdleness,
    ];
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemEvent {
    Malloc,
    Access,
    Free,
}

#[derive(Debug, Default)]
struct BlockHistory {
    events: Vec<(MemEvent, u64)>,
    found: Vec<Inefficiency>,
}

/// Per-process state of the analysis. Blocks are identified by their allocation id.
#[derive(Debug)]
pub struct InefficientAnalyzer {
    api: u64,
    in_op: bool,
    /// Memory events of the current operator, classified at its end.
    op_has_malloc: bool,
    op_has_free: bool,
    /// The last API that allocated / freed anything (u64::MAX: none yet).
    malloc_api: u64,
    free_api: u64,
    blocks: HashMap<u64, BlockHistory>,
    threshold: u64,
}

impl Default for InefficientAnalyzer {
    fn default() -> Self {
        InefficientAnalyzer {
            api: 0,
            in_op: false,
            op_has_malloc: false,
            op_has_free: false,
            malloc_api: u64::MAX,
            free_api: u64::MAX,
            blocks: HashMap::new(),
            threshold: IDLE_THRESHOLD,
        }
    }
}

impl InefficientAnalyzer {
    pub fn op_start(&mut self) {
        self.in_op = true;
        self.api += 1;
        self.op_has_malloc = false;
        self.op_has_free = false;
    }

    pub fn op_end(&mut self) {
        if !self.in_op {
            return;
        }
        self.in_op = false;
        if self.op_has_malloc {
            self.malloc_api = self.api;
        }
        if self.op_has_free {
            self.free_api = self.api;
        }
    }

    /// Records a memory event of block `id`; returns the classifications found on it so far.
    pub fn event(&mut self, id: u64, ev: MemEvent) -> &[Inefficiency] {
        if !self.in_op {
            // Outside an operator the event is an API by itself, classified at once.
            self.api += 1;
        }
        let api = self.api;
        let h = self.blocks.entry(id).or_default();
        h.events.push((ev, api));
        let mut found = Vec::new();
        if h.events
            .first()
            .is_some_and(|(e, _)| *e == MemEvent::Malloc)
        {
            match ev {
                MemEvent::Access => {
                    let n = h.events.len();
                    if n >= 2 {
                        let (prev, prev_api) = h.events[n - 2];
                        if prev == MemEvent::Access && api - prev_api > self.threshold {
                            found.push(Inefficiency::TemporaryIdleness);
                        }
                    }
                    if self.free_api != u64::MAX {
                        let malloc_api = h.events[0].1;
                        let first_access = h
                            .events
                            .iter()
                            .find(|(e, a)| *e == MemEvent::Access && *a != malloc_api)
                            .map(|(_, a)| *a);
                        if let Some(fa) = first_access
                            && malloc_api != self.free_api
                            && malloc_api < self.free_api
                            && self.free_api < fa
                        {
                            found.push(Inefficiency::EarlyAllocation);
                        }
                    }
                }
                MemEvent::Free => {
                    let n = h.events.len();
                    if self.malloc_api != u64::MAX && n >= 2 {
                        let (last, last_api) = h.events[n - 2];
                        if last == MemEvent::Access
                            && last_api != api
                            && last_api < self.malloc_api
                            && self.malloc_api < api
                        {
                            found.push(Inefficiency::LateDeallocation);
                        }
                    }
                }
                MemEvent::Malloc => {}
            }
        }
        for f in found {
            if !h.found.contains(&f) {
                h.found.push(f);
            }
        }
        match ev {
            MemEvent::Malloc if self.in_op => self.op_has_malloc = true,
            MemEvent::Free if self.in_op => self.op_has_free = true,
            MemEvent::Malloc => self.malloc_api = api,
            MemEvent::Free => self.free_api = api,
            MemEvent::Access => {}
        }
        self.found(id)
    }

    /// Classifications of a block (empty if none).
    pub fn found(&self, id: u64) -> &[Inefficiency] {
        self.blocks
            .get(&id)
            .map(|h| h.found.as_slice())
            .unwrap_or(&[])
    }

    /// Every flagged block with its classifications.
    pub fn flagged(&self) -> impl Iterator<Item = (u64, &[Inefficiency])> {
        self.blocks
            .iter()
            .filter(|(_, h)| !h.found.is_empty())
            .map(|(id, h)| (*id, h.found.as_slice()))
    }
}

/// `early_allocation,late_deallocation` etc. for the Attr column.
pub fn attr_value(found: &[Inefficiency]) -> String {
    found
        .iter()
        .map(|f| f.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use MemEvent::*;

    fn op(a: &mut InefficientAnalyzer, events: &[(u64, MemEvent)]) {
        a.op_start();
        for (id, e) in events {
            a.event(*id, *e);
        }
        a.op_end();
    }

    #[test]
    fn early_allocation_when_another_block_is_freed_before_the_first_use() {
        let mut a = InefficientAnalyzer::default();
        op(&mut a, &[(1, Malloc), (2, Malloc), (2, Access)]); // api 1
        op(&mut a, &[(2, Free)]); // api 2 frees another block
        op(&mut a, &[(1, Access)]); // api 3: first use of block 1
        assert_eq!(a.found(1), [Inefficiency::EarlyAllocation]);
        assert!(a.found(2).is_empty());
    }

    #[test]
    fn late_deallocation_when_another_block_is_allocated_after_the_last_use() {
        let mut a = InefficientAnalyzer::default();
        op(&mut a, &[(1, Malloc), (1, Access)]); // api 1
        op(&mut a, &[(2, Malloc)]); // api 2 allocates another block
        op(&mut a, &[(1, Free)]); // api 3
        assert_eq!(a.found(1), [Inefficiency::LateDeallocation]);
    }

    #[test]
    fn temporary_idleness_past_the_threshold_only() {
        let mut a = InefficientAnalyzer::default();
        op(
            &mut a,
            &[(1, Malloc), (1, Access), (2, Malloc), (2, Access)],
        );
        for _ in 0..3000 {
            op(&mut a, &[]);
        }
        op(&mut a, &[(2, Access)]); // exactly 3001 APIs later: flagged (> 3000)
        assert_eq!(a.found(2), [Inefficiency::TemporaryIdleness]);
        let mut b = InefficientAnalyzer::default();
        op(&mut b, &[(1, Malloc), (1, Access)]);
        for _ in 0..2999 {
            op(&mut b, &[]);
        }
        op(&mut b, &[(1, Access)]); // 3000 later: not flagged
        assert!(b.found(1).is_empty());
    }

    #[test]
    fn a_clean_block_and_events_outside_operators() {
        let mut a = InefficientAnalyzer::default();
        a.event(1, Malloc); // api 1 (outside an op)
        op(&mut a, &[(1, Access)]); // api 2
        a.event(1, Free); // api 3
        assert!(a.found(1).is_empty());
        assert_eq!(a.flagged().count(), 0);
        // A block whose first event is not a MALLOC (allocated before tracing) is not judged.
        op(&mut a, &[(9, Access)]);
        assert!(a.found(9).is_empty());
        assert_eq!(
            attr_value(&[
                Inefficiency::EarlyAllocation,
                Inefficiency::TemporaryIdleness
            ]),
            "early_allocation,temporary_idleness"
        );
    }
}
