//! Stacks in the session: CPython found and configured per process, and the C and Python
//! stacks attached to the call they were taken for.

use super::Session;
use crate::events::decode::{Call, CallEvent, Decoded};
use crate::state::AddrHash;
use std::collections::HashMap;
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

    /// The Python stack of a call: the sample BPF sent for it (same thread, same `ts_ns`), or
    /// a marker saying why there is none.
    pub(super) fn python_stack_of(&mut self, ev: &Decoded, ts_ns: u64) -> Option<Arc<str>> {
        let Decoded::Call(call) = ev else { return None };
        let py = self.python.as_ref()?;
        let text = take_own(&mut self.pending_py, call, ts_ns, |p| p.ts_ns).map(|p| p.text);
        if self.cfg.observer.is_some() {
            // The agent shows Python frames in the C stacks only (mixed): no column to fill,
            // and no marker text to make for each call of the node's processes.
            return text;
        }
        text.or_else(|| py.without_sample(call.pid))
    }

    /// Pairs a call with the stack sample BPF sent for it (same thread, same `ts_ns`).
    pub(super) fn stack_job(
        &mut self,
        ev: &Decoded,
        ts_ns: u64,
    ) -> Option<(u64, Option<Arc<str>>)> {
        let Decoded::Call(call) = ev else { return None };
        let resolver = self.stacks.as_mut()?;
        let sample = take_own(&mut self.pending_stacks, call, ts_ns, |s| s.ts_ns)?;
        if let Some(obs) = &mut self.cfg.observer
            && !obs.wants_stack(call)
        {
            return None;
        }
        // Before `python_stack_of` takes the Python sample of the same call.
        let python = self
            .pending_py
            .get(&call.tid)
            .filter(|p| p.ts_ns == ts_ns)
            .and_then(|p| p.frames.clone());
        Some((resolver.submit(sample, call.at_return, python), None))
    }
}

/// The sample waiting for thread `call.tid` if it was taken for this call (dated `ts_ns`, as
/// its record is); a sample of a later call stays for it. Calls of one thread can arrive out
/// of order: the node agent batches unsampled calls per CPU, and a batch sent from another
/// CPU can come between a sample and its call. The chunks of one mstx batch share the
/// sample sent before the first of them (and its date), so they leave it in place.
fn take_own<T: Clone>(
    pending: &mut HashMap<u32, T, AddrHash>,
    call: &CallEvent,
    ts_ns: u64,
    date: impl Fn(&T) -> u64,
) -> Option<T> {
    let own = pending.get(&call.tid).filter(|s| date(s) == ts_ns)?;
    match call.call {
        Call::RegionsRegister { .. } | Call::RegionsUnregister { .. } => Some(own.clone()),
        _ => pending.remove(&call.tid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(tid: u32, call: Call) -> CallEvent {
        CallEvent {
            pid: 1,
            tid,
            ts_mono: 0,
            call,
            at_return: true,
        }
    }

    #[test]
    fn a_sample_goes_to_its_own_call_only() {
        let free = |tid| call(tid, Call::HalFree { addr: 0x10, ret: 0 });
        let mut pending: HashMap<u32, u64, AddrHash> = HashMap::default();
        // The sample of thread 7's call dated 200 came before a call dated 100 of the same
        // thread (a batch sent from another CPU in between): that one takes nothing.
        pending.insert(7, 200);
        assert_eq!(take_own(&mut pending, &free(7), 100, |d| *d), None);
        assert_eq!(take_own(&mut pending, &free(8), 200, |d| *d), None);
        assert_eq!(take_own(&mut pending, &free(7), 200, |d| *d), Some(200));
        assert!(pending.is_empty(), "taken once");
        // The chunks of an mstx batch share their sample.
        pending.insert(7, 300);
        let chunk = call(
            7,
            Call::RegionsRegister {
                domain: 0,
                regions: Vec::new(),
                first: 0,
                total: 0,
            },
        );
        assert_eq!(take_own(&mut pending, &chunk, 300, |d| *d), Some(300));
        assert_eq!(take_own(&mut pending, &chunk, 300, |d| *d), Some(300));
    }
}
