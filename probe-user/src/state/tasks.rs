//! MindSpore's pipeline: in its default (asynchronous) mode an operator called from Python
//! is run, and its output blocks allocated, on worker threads (`frontend_queue`, then
//! `backend_queue`, then the launch thread), where no Python frame is. Each hop is a task
//! enqueued with `AsyncRQueue::Push` and started with its class's `Run()`: the Python stack of
//! the thread that enqueued a task (or, for a worker enqueuing the next hop, the stack its
//! own task carried) goes with the task, and what a worker does while running it (pool
//! blocks, workspaces, launches) gets that stack when it has none of its own.

use std::collections::HashMap;
use std::sync::Arc;

use crate::events::decode::{Call, CallEvent};

/// Enqueued tasks kept waiting for their start at most (tasks whose class is not probed
/// never start as far as we know: the oldest entries go when this is reached).
const MAX_WAITING: usize = 1 << 16;

#[derive(Debug, Default)]
pub struct TaskStacks {
    /// Task address -> the Python stack of whoever enqueued it, until it starts.
    waiting: HashMap<u64, Arc<str>>,
    /// Worker thread -> the Python stack of the task it runs now (its last started one).
    running: HashMap<u32, Arc<str>>,
}

/// A Python stack with frames (not only a `[python: ...]` marker saying why there are none).
fn has_frames(stack: &str) -> bool {
    !stack.is_empty() && !stack.starts_with("[python:")
}

impl TaskStacks {
    /// Follows `ev` through the pipeline; `own` is the Python stack BPF took for it (None: no
    /// walk, Python stacks off or a call the default line leaves out), replaced by the
    /// enqueuer's when it has no frames and its thread is running a task.
    pub fn carry(&mut self, ev: &CallEvent, own: &mut Option<Arc<str>>) {
        let framed = own.as_deref().is_some_and(has_frames);
        let inherited = (!framed)
            .then(|| self.running.get(&ev.tid).cloned())
            .flatten();
        match &ev.call {
            Call::MsTaskPush { task } => {
                let carried = if framed { own.clone() } else { inherited };
                match carried {
                    Some(s) => {
                        if self.waiting.len() >= MAX_WAITING {
                            self.waiting.clear();
                        }
                        self.waiting.insert(*task, s);
                    }
                    // An address freed and reused for a task of unknown origin.
                    None => {
                        self.waiting.remove(task);
                    }
                }
            }
            Call::MsTaskRun { task } => match self.waiting.remove(task) {
                Some(s) => {
                    self.running.insert(ev.tid, s);
                }
                None => {
                    self.running.remove(&ev.tid);
                }
            },
            _ => {
                if let Some(s) = inherited {
                    *own = Some(s);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(tid: u32, call: Call) -> CallEvent {
        CallEvent {
            pid: 1,
            tid,
            ts_mono: 0,
            call,
            at_return: false,
        }
    }

    fn alloc() -> Call {
        Call::MsPoolAlloc {
            pool: 1,
            size: 512,
            addr: 0x10,
            pool_used: None,
            pool_reserved: None,
        }
    }

    /// Applies `call` on `tid` with the stack BPF took, returns the stack its rows get.
    fn apply(t: &mut TaskStacks, tid: u32, call: Call, stack: &str) -> String {
        let mut own = Some(Arc::from(stack));
        t.carry(&ev(tid, call), &mut own);
        own.unwrap().to_string()
    }

    #[test]
    fn the_enqueuers_python_line_follows_the_task_across_threads() {
        let py = "train.py:42 main\n";
        let none = "[python: no thread state]\n";
        let mut t = TaskStacks::default();
        // Python (1) -> frontend_queue (3) -> backend_queue (6), which allocates.
        apply(&mut t, 1, Call::MsTaskPush { task: 0xa }, py);
        assert_eq!(apply(&mut t, 6, alloc(), none), none, "no task yet");
        apply(&mut t, 3, Call::MsTaskRun { task: 0xa }, none);
        apply(&mut t, 3, Call::MsTaskPush { task: 0xb }, none);
        apply(&mut t, 6, Call::MsTaskRun { task: 0xb }, none);
        assert_eq!(apply(&mut t, 6, alloc(), none), py);
        // A thread with frames of its own keeps them.
        assert_eq!(
            apply(&mut t, 1, alloc(), "other.py:1 f\n"),
            "other.py:1 f\n"
        );
        // A task nobody traced the enqueuing of (pushed before the attach, or an address
        // reused): its thread's next allocations get no stale line.
        apply(&mut t, 6, Call::MsTaskRun { task: 0xc }, none);
        assert_eq!(apply(&mut t, 6, alloc(), none), none);
        // A task starts once: its stack is not given to a later task at the same address.
        apply(&mut t, 6, Call::MsTaskRun { task: 0xb }, none);
        assert_eq!(apply(&mut t, 6, alloc(), none), none);
        // Without Python stacks nothing is carried.
        let mut own = None;
        t.carry(&ev(1, Call::MsTaskPush { task: 0xd }), &mut own);
        assert!(t.waiting.is_empty() && own.is_none());
    }

    #[test]
    fn a_task_started_without_a_walk_still_gives_its_line() {
        // The default line walks the push (and allocations), not the worker's start of the
        // task: a start with no stack of its own still hands the task's line on.
        let py = "train.py:7 step\n";
        let none = "[python: no thread state]\n";
        let mut t = TaskStacks::default();
        apply(&mut t, 1, Call::MsTaskPush { task: 0xa }, py);
        let mut own = None;
        t.carry(&ev(3, Call::MsTaskRun { task: 0xa }), &mut own);
        assert!(own.is_none());
        assert_eq!(apply(&mut t, 3, alloc(), none), py);
        let mut own = None;
        t.carry(&ev(3, alloc()), &mut own);
        assert_eq!(own.as_deref(), Some(py));
    }
}
