//! Puts ATB calls back together (spec §1.8). One `Runner::Execute` call reaches us as several
//! events from probes on the same instruction (name, save-tensor dir, pack, tensors before;
//! end and tensors after), and one `SaveLaunchParam` call as three (path, input and output
//! tensors), in no fixed order among the probes of one instruction. This module turns them
//! into operator and kernel starts/ends, each followed by its tensor accesses, in the order
//! msMemScope reports them.
//!
//! Events arrive per thread in time order, so everything an entry probe saw precedes what the
//! return probes saw, and a nested `Execute` (a graph runner running its nodes) lies entirely
//! between its parent's entry and return: a per-thread stack of open operators keyed by
//! (runner, pack) is enough.

use std::collections::HashMap;

use crate::events::decode::{AtbEvent, AtbTensor};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AtbOut {
    OpStart {
        name: String,
        path: String,
        workspace: u64,
        workspace_size: u64,
        ts_ns: u64,
    },
    OpEnd {
        name: String,
        path: String,
        workspace: u64,
        workspace_size: u64,
        ts_ns: u64,
    },
    /// `end`: the "after" half of a kernel (path ending in `/after`).
    Kernel {
        name: String,
        path: String,
        end: bool,
        ts_ns: u64,
    },
    /// A tensor access: inputs are UNKNOWN, outputs WRITE. `owner` is the operator or kernel.
    Access {
        owner: String,
        tensor: AtbTensor,
        write: bool,
        ts_ns: u64,
    },
}

/// Open operators kept per thread (nesting deeper than this is not expected).
const MAX_OPEN_OPS: usize = 64;

#[derive(Debug, Default)]
struct OpState {
    runner: u64,
    pack: u64,
    name: Option<String>,
    dir: Option<String>,
    workspace: Option<(u64, u64)>,
    entry_ts: u64,
    started: bool,
    ended: bool,
    /// Accesses waiting for the start (before) or the end (after) row.
    before: Vec<(AtbTensor, bool, u64)>,
    after: Vec<(AtbTensor, bool, u64)>,
}

impl OpState {
    fn start_row(&self) -> AtbOut {
        let (workspace, workspace_size) = self.workspace.unwrap_or_default();
        AtbOut::OpStart {
            name: self.name.clone().unwrap_or_default(),
            path: self.dir.clone().unwrap_or_default(),
            workspace,
            workspace_size,
            ts_ns: self.entry_ts,
        }
    }

    fn access(&self, (tensor, write, ts_ns): (AtbTensor, bool, u64)) -> AtbOut {
        AtbOut::Access {
            owner: self.name.clone().unwrap_or_default(),
            tensor,
            write,
            ts_ns,
        }
    }

    fn start(&mut self, out: &mut Vec<AtbOut>) {
        if self.started {
            return;
        }
        self.started = true;
        out.push(self.start_row());
        for a in std::mem::take(&mut self.before) {
            out.push(self.access(a));
        }
    }
}

/// One `SaveLaunchParam` call being put together.
#[derive(Debug, Default)]
struct KernelState {
    param: u64,
    path: Option<String>,
    /// Parts seen: the path, and the first chunk of the inputs and of the outputs.
    seen: [bool; 3],
    waiting: Vec<(AtbTensor, bool, u64)>,
}

#[derive(Debug, Default)]
struct ThreadState {
    ops: Vec<OpState>,
    kernel: Option<KernelState>,
}

#[derive(Debug, Default)]
pub struct AtbAssembler {
    threads: HashMap<u32, ThreadState>,
}

/// `<dir>/<kernel>/before` -> (`<kernel>`, false); `.../after` -> (`<kernel>`, true).
pub fn kernel_of_path(path: &str) -> (String, bool) {
    let trimmed = path.trim_end_matches('/');
    let (rest, end) = if let Some(r) = trimmed.strip_suffix("/after") {
        (r, true)
    } else if let Some(r) = trimmed.strip_suffix("/before") {
        (r, false)
    } else {
        (trimmed, false)
    };
    let name = rest.rsplit('/').next().unwrap_or(rest);
    (name.to_string(), end)
}

impl AtbAssembler {
    /// Feeds one event of thread `tid`; returns the rows it completes, in report order.
    pub fn on_event(
        &mut self,
        tid: u32,
        object: u64,
        pack: u64,
        event: AtbEvent,
        ts_ns: u64,
    ) -> Vec<AtbOut> {
        let mut out = Vec::new();
        let t = self.threads.entry(tid).or_default();
        match event {
            AtbEvent::KernelDir(_) | AtbEvent::KernelTensors { .. } => {
                Self::kernel_event(t, object, event, ts_ns, &mut out);
            }
            AtbEvent::End | AtbEvent::Tensors { after: true, .. } => {
                Self::flush_kernel(t, &mut out);
                // The operator is the innermost open one with this key; anything above it
                // has ended already (nested runners).
                let found = t
                    .ops
                    .iter()
                    .rposition(|o| o.runner == object && o.pack == pack);
                let i = match found {
                    Some(i) => {
                        t.ops.truncate(i + 1);
                        i
                    }
                    None => {
                        // Its entry was not seen (attached mid-call): report what we have.
                        t.ops.push(OpState {
                            runner: object,
                            pack,
                            entry_ts: ts_ns,
                            ..Default::default()
                        });
                        t.ops.len() - 1
                    }
                };
                let op = &mut t.ops[i];
                match event {
                    AtbEvent::End => {
                        op.start(&mut out);
                        let (workspace, workspace_size) = op.workspace.unwrap_or_default();
                        out.push(AtbOut::OpEnd {
                            name: op.name.clone().unwrap_or_default(),
                            path: op.dir.clone().unwrap_or_default(),
                            workspace,
                            workspace_size,
                            ts_ns,
                        });
                        op.ended = true;
                        for a in std::mem::take(&mut op.after) {
                            out.push(op.access(a));
                        }
                    }
                    AtbEvent::Tensors {
                        output, tensors, ..
                    } => {
                        for tensor in tensors {
                            let a = (tensor, output, ts_ns);
                            if op.ended {
                                out.push(op.access(a));
                            } else {
                                op.after.push(a);
                            }
                        }
                    }
                    _ => unreachable!(),
                }
            }
            _ => {
                Self::flush_kernel(t, &mut out);
                // An entry part: ended operators on top are done for good.
                while t.ops.last().is_some_and(|o| o.ended) {
                    t.ops.pop();
                }
                let same = t
                    .ops
                    .last()
                    .is_some_and(|o| o.runner == object && o.pack == pack);
                if !same {
                    // Operators that never return (an exception out of Execute) stay below;
                    // keep a bounded number, reported as started.
                    if t.ops.len() >= MAX_OPEN_OPS {
                        let mut oldest = t.ops.remove(0);
                        oldest.start(&mut out);
                    }
                    t.ops.push(OpState {
                        runner: object,
                        pack,
                        entry_ts: ts_ns,
                        ..Default::default()
                    });
                }
                let op = t.ops.last_mut().expect("pushed");
                op.entry_ts = op.entry_ts.min(ts_ns);
                match event {
                    AtbEvent::Name(n) => op.name = Some(n),
                    AtbEvent::Dir(d) => op.dir = Some(d),
                    AtbEvent::Pack {
                        workspace,
                        workspace_size,
                    } => op.workspace = Some((workspace, workspace_size)),
                    AtbEvent::Tensors {
                        output, tensors, ..
                    } => {
                        for tensor in tensors {
                            let a = (tensor, output, ts_ns);
                            if op.started {
                                out.push(op.access(a));
                            } else {
                                op.before.push(a);
                            }
                        }
                    }
                    _ => unreachable!(),
                }
                if op.name.is_some() && op.dir.is_some() && op.workspace.is_some() {
                    op.start(&mut out);
                }
            }
        }
        out
    }

    fn kernel_event(
        t: &mut ThreadState,
        param: u64,
        event: AtbEvent,
        ts_ns: u64,
        out: &mut Vec<AtbOut>,
    ) {
        let part = match &event {
            AtbEvent::KernelDir(_) => 0,
            AtbEvent::KernelTensors { output, first, .. } => {
                if *first == 0 {
                    1 + *output as usize
                } else {
                    usize::MAX
                }
            }
            _ => return,
        };
        // A part seen twice, or another launch parameter, is the next call.
        let next_call = t
            .kernel
            .as_ref()
            .is_some_and(|k| k.param != param || (part != usize::MAX && k.seen[part]));
        if next_call {
            Self::flush_kernel(t, out);
        }
        let k = t.kernel.get_or_insert_with(|| KernelState {
            param,
            ..Default::default()
        });
        if part != usize::MAX {
            k.seen[part] = true;
        }
        match event {
            AtbEvent::KernelDir(path) => {
                let (name, end) = kernel_of_path(&path);
                out.push(AtbOut::Kernel {
                    name: name.clone(),
                    path: path.clone(),
                    end,
                    ts_ns,
                });
                k.path = Some(path);
                for (tensor, write, ts_ns) in std::mem::take(&mut k.waiting) {
                    out.push(AtbOut::Access {
                        owner: name.clone(),
                        tensor,
                        write,
                        ts_ns,
                    });
                }
            }
            AtbEvent::KernelTensors {
                output, tensors, ..
            } => {
                for tensor in tensors {
                    match &k.path {
                        Some(path) => out.push(AtbOut::Access {
                            owner: kernel_of_path(path).0,
                            tensor,
                            write: output,
                            ts_ns,
                        }),
                        None => k.waiting.push((tensor, output, ts_ns)),
                    }
                }
            }
            _ => {}
        }
    }

    /// Ends the thread's kernel call: accesses still waiting for a path (it could not be read)
    /// are reported without a kernel name.
    fn flush_kernel(t: &mut ThreadState, out: &mut Vec<AtbOut>) {
        if let Some(k) = t.kernel.take() {
            for (tensor, write, ts_ns) in k.waiting {
                out.push(AtbOut::Access {
                    owner: String::new(),
                    tensor,
                    write,
                    ts_ns,
                });
            }
        }
    }

    /// The thread exited or tracing ended: operators that never returned are reported as
    /// started (their accesses included), so nothing seen is lost.
    pub fn finish(&mut self) -> Vec<(u32, Vec<AtbOut>)> {
        let mut all = Vec::new();
        let mut tids: Vec<u32> = self.threads.keys().copied().collect();
        tids.sort_unstable();
        for tid in tids {
            let mut t = self.threads.remove(&tid).expect("listed");
            let mut out = Vec::new();
            Self::flush_kernel(&mut t, &mut out);
            for op in &mut t.ops {
                op.start(&mut out);
                for a in std::mem::take(&mut op.after) {
                    out.push(op.access(a));
                }
            }
            if !out.is_empty() {
                all.push((tid, out));
            }
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(addr: u64) -> AtbTensor {
        AtbTensor {
            addr,
            size: 16,
            dtype: 1,
            format: 2,
            shape: vec![2, 4],
        }
    }

    fn kinds(out: &[AtbOut]) -> Vec<String> {
        out.iter()
            .map(|o| match o {
                AtbOut::OpStart { name, .. } => format!("start {name}"),
                AtbOut::OpEnd { name, .. } => format!("end {name}"),
                AtbOut::Kernel { name, end, .. } => format!("kernel {name} {end}"),
                AtbOut::Access {
                    owner,
                    tensor,
                    write,
                    ..
                } => format!("access {owner} {:#x} {write}", tensor.addr),
            })
            .collect()
    }

    #[test]
    fn parts_in_any_order_nested_runners_and_kernels() {
        let mut a = AtbAssembler::default();
        let mut out = Vec::new();
        let tensors = |output, after, addrs: &[u64]| AtbEvent::Tensors {
            output,
            after,
            tensors: addrs.iter().map(|a| tensor(*a)).collect(),
            first: 0,
        };
        // Parent (runner 1, pack 10): tensors before its name, dir and pack.
        out.extend(a.on_event(7, 1, 10, tensors(false, false, &[0x100]), 5));
        assert!(out.is_empty(), "nothing before the start row is complete");
        out.extend(a.on_event(7, 1, 10, AtbEvent::Name("Linear".into()), 6));
        out.extend(a.on_event(7, 1, 10, AtbEvent::Dir("d/0_Linear".into()), 7));
        out.extend(a.on_event(
            7,
            1,
            10,
            AtbEvent::Pack {
                workspace: 0x900,
                workspace_size: 64,
            },
            8,
        ));
        out.extend(a.on_event(7, 1, 10, tensors(true, false, &[0x200]), 9));
        // A kernel: tensors first, then its path.
        out.extend(a.on_event(
            7,
            50,
            0,
            AtbEvent::KernelTensors {
                output: false,
                tensors: vec![tensor(0x100)],
                first: 0,
            },
            10,
        ));
        out.extend(a.on_event(
            7,
            50,
            0,
            AtbEvent::KernelDir("d/0_Linear/MatMul/before".into()),
            11,
        ));
        // Nested child (runner 2, pack 20), all parts, then its end.
        out.extend(a.on_event(7, 2, 20, AtbEvent::Name("Add".into()), 12));
        out.extend(a.on_event(7, 2, 20, AtbEvent::Dir("d/1_Add".into()), 12));
        out.extend(a.on_event(
            7,
            2,
            20,
            AtbEvent::Pack {
                workspace: 0,
                workspace_size: 0,
            },
            12,
        ));
        out.extend(a.on_event(7, 2, 20, tensors(true, true, &[0x300]), 13));
        out.extend(a.on_event(7, 2, 20, AtbEvent::End, 14));
        // The same launch parameter again: the "after" call.
        out.extend(a.on_event(
            7,
            50,
            0,
            AtbEvent::KernelDir("d/0_Linear/MatMul/after".into()),
            15,
        ));
        out.extend(a.on_event(7, 1, 10, AtbEvent::End, 16));
        out.extend(a.on_event(7, 1, 10, tensors(true, true, &[0x200]), 17));
        assert_eq!(
            kinds(&out),
            [
                "start Linear",
                "access Linear 0x100 false",
                "access Linear 0x200 true",
                "kernel MatMul false",
                "access MatMul 0x100 false",
                "start Add",
                "end Add",
                "access Add 0x300 true",
                "kernel MatMul true",
                "end Linear",
                "access Linear 0x200 true",
            ]
        );
        assert_eq!(
            out[0],
            AtbOut::OpStart {
                name: "Linear".into(),
                path: "d/0_Linear".into(),
                workspace: 0x900,
                workspace_size: 64,
                ts_ns: 5
            }
        );
        assert!(a.finish().is_empty());

        // The same runner and pack run again: a new operator, not the ended one.
        let again = a.on_event(7, 1, 10, AtbEvent::Name("Linear".into()), 20);
        assert!(again.is_empty());
        let left = a.finish();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].0, 7);
        assert_eq!(kinds(&left[0].1), ["start Linear"]);
    }

    #[test]
    fn operators_that_never_return_do_not_pile_up() {
        let mut a = AtbAssembler::default();
        let mut out = Vec::new();
        for runner in 0..200u64 {
            out.extend(a.on_event(3, runner, 0, AtbEvent::Name(format!("op{runner}")), runner));
        }
        assert!(a.threads[&3].ops.len() <= MAX_OPEN_OPS);
        out.extend(a.finish().into_iter().flat_map(|(_, o)| o));
        // Every one is still reported, exactly once, in order.
        let names: Vec<String> = kinds(&out);
        let want: Vec<String> = (0..200).map(|r| format!("start op{r}")).collect();
        assert_eq!(names, want);
    }

    #[test]
    fn kernel_names_come_from_the_path() {
        assert_eq!(
            kernel_of_path("a/b/MatMul/before"),
            ("MatMul".into(), false)
        );
        assert_eq!(kernel_of_path("a/b/MatMul/after/"), ("MatMul".into(), true));
        assert_eq!(kernel_of_path("Kernel"), ("Kernel".into(), false));
    }
}
