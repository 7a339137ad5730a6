//! mstx steps: the `--steps` filter and what happens when a step ends.

use super::{BlockKind, ProcessState};
use crate::analysis::steps::{LiveBlock, outlives_its_step};

/// `--steps`: the mstx steps whose events are kept (empty: all events).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepFilter {
    steps: [u32; 5],
    len: usize,
}

impl StepFilter {
    pub fn new(steps: &[u32]) -> Self {
        let mut f = StepFilter::default();
        for s in steps.iter().take(5) {
            f.steps[f.len] = *s;
            f.len += 1;
        }
        f
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(super) fn keeps(&self, in_step: bool, step: u32) -> bool {
        self.is_empty() || (in_step && self.steps[..self.len].contains(&step))
    }
}

impl ProcessState {
    /// The current mstx step (0 before the first `"step start"` range).
    pub fn step(&self) -> u32 {
        self.step
    }
}

impl ProcessState {
    /// End of an mstx step: pool blocks that outlived it, and the step's allocation swing.
    pub(super) fn step_ended(&mut self) {
        let live: Vec<LiveBlock> = self
            .pool_blocks
            .values()
            .filter_map(|b| match b.kind {
                BlockKind::Pool(pool) => Some(LiveBlock {
                    pool,
                    device: b.device,
                    addr: b.addr,
                    size: b.size,
                    alloc_step: b.step,
                    kernel_index: b.kernel_index,
                }),
                _ => None,
            })
            .collect();
        let step = self.step;
        // Keep the leaking blocks themselves (their stacks name the program's line).
        for b in self.pool_blocks.values() {
            if let BlockKind::Pool(pool) = b.kind
                && outlives_its_step(pool, b.step, step)
            {
                self.step_leak_blocks
                    .entry(b.allocation_id)
                    .or_insert_with(|| (b.clone(), step))
                    .1 = step;
            }
        }
        self.messages
            .extend(self.step_leaks.on_step_end(step, &live));
        self.messages.extend(self.gaps.on_step_end(step));
    }
}
