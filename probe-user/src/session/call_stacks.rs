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
    pub(super) fn configure_python(&mut self, pid: u32, mut again: bool) {
        // The agent sees every exec and open on the node: only processes it picked up, and
        // each once (an exec forgets what was found).
        if self.cfg.observer.is_some() {
            if again && !self.procs.contains_key(&pid) {
                return;
            }
            again = false;
        }
        // Calls come in runs from one process: after a look without `again`, further ones
        // change nothing until the process is forgotten (two map lookups saved per call).
        if !again && self.python_checked == Some(pid) {
            return;
        }
        if let Some(py) = &mut self.python {
            py.enable(&mut self.bpf, pid, again);
            if !again && py.was_looked_at(pid) {
                self.python_checked = Some(pid);
            }
        }
    }

    pub(super) fn forget_python(&mut self, pid: u32) {
        if self.python_checked == Some(pid) {
            self.python_checked = None;
        }
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
        if self.cfg.observer.is_some() {
            // The agent shows Python frames in the C stacks only (mixed): no column to fill,
            // and no marker text to make for each call of the node's processes.
            return text;
        }
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
