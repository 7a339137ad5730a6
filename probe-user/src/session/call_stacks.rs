//! Stacks in the session: CPython found and configured per process, and the C and Python
//! stacks attached to the call they were taken for.

use super::Session;
use crate::events::decode::{Call, Decoded};
use std::sync::Arc;

impl Session {
    /// Looks for CPython in a process not known to run it yet, and tells BPF where its frames
    /// are. Cheap when there is nothing to do (a map lookup, or reading /proc/PID/maps).
    /// `again`: look again in a process where none was found before (it may have loaded
    /// libpython since).
    pub(super) fn configure_python(&mut self, pid: u32, again: bool) {
        if let Some(py) = &mut self.python {
            py.enable(&mut self.bpf, pid, again);
        }
    }

    pub(super) fn forget_python(&mut self, pid: u32) {
        if let Some(py) = &mut self.python {
            py.forget(pid);
            self.bpf.forget_python_process(pid);
        }
    }

    /// The Python stack of a call: the sample BPF sent just before it on the same thread, or
    /// a marker saying why there is none.
    pub(super) fn python_stack_of(&mut self, ev: &Decoded) -> Option<Arc<str>> {
        let Decoded::Call(call) = ev else { return None };
        let py = self.python.as_ref()?;
        let batch = matches!(
            call.call,
            Call::RegionsRegister { .. } | Call::RegionsUnregister { .. }
        );
        let text = if batch {
            self.pending_py.get(&call.tid).map(|p| p.0.clone())
        } else {
            self.pending_py.remove(&call.tid).map(|p| p.0)
        };
        Some(text.unwrap_or_else(|| py.without_sample(call.pid)))
    }

    /// Pairs a call with the stack sample BPF sent just before it on the same thread.
    pub(super) fn stack_job(&mut self, ev: &Decoded) -> Option<(u64, Option<Arc<str>>)> {
        let Decoded::Call(call) = ev else { return None };
        let resolver = self.stacks.as_mut()?;
        if let Some(obs) = &mut self.cfg.observer
            && !obs.wants_stack(call)
        {
            self.pending_stacks.remove(&call.tid);
            return None;
        }
        // The chunks of one batch share the sample sent before the first of them.
        let batch = matches!(
            call.call,
            Call::RegionsRegister { .. } | Call::RegionsUnregister { .. }
        );
        let sample = if batch {
            self.pending_stacks.get(&call.tid).cloned()
        } else {
            self.pending_stacks.remove(&call.tid)
        }?;
        // Before `python_stack_of` takes the Python sample of the same call.
        let python = self.pending_py.get(&call.tid).and_then(|p| p.1.clone());
        Some((resolver.submit(sample, call.at_return, python), None))
    }
}
