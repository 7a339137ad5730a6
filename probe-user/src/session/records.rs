//! One ring-buffer record at a time: Python and C stack samples wait for their call; a call
//! record is decoded, ordered and, when its process is traced, applied to its state.

use super::{Pending, PendingPython, PendingStacks, Session, clock_ns};
use crate::events::decode::{Call, CallEvent, Decoded};
use crate::events::{decode, pystacks, stacks};
use crate::log;
use crate::trace::probes::{KernelRef, launch_args};
use anyhow::Result;
use probe_common::RawEvent;

impl Session {
    pub(super) fn handle_record(&mut self, item: &[u8]) -> Result<()> {
        if let Some(sample) = pystacks::sample_from_bytes(item) {
            self.events += 1;
            // Resolved now: the code objects are read while the process is surely alive.
            if let Some(py) = &mut self.python {
                let (stack, text) = py.resolve_text(&sample);
                let frames = self.cfg.mixed.then_some(stack);
                let pending = PendingPython {
                    ts_ns: sample.ts_ns,
                    text,
                    frames,
                };
                self.pending_py.insert(sample.tid, pending);
            }
            return Ok(());
        }
        if let Some(code) = pystacks::code_record_from_bytes(item) {
            if let Some(py) = &mut self.python {
                py.learn(code);
            }
            return Ok(());
        }
        if let Some(sample) = stacks::sample_from_bytes(item) {
            self.events += 1;
            stacks::count_copy(&sample);
            self.pending_stacks.insert(sample.tid, sample);
            return Ok(());
        }
        match decode::raw_from_bytes(item) {
            Some(raw) => self.handle_raw(&raw),
            None => Ok(()),
        }
    }

    pub(super) fn handle_raw(&mut self, raw: &RawEvent) -> Result<()> {
        {
            let Some(ev) = decode::decode(raw) else {
                return Ok(());
            };
            self.events += 1;
            if let Decoded::Exit { pid, .. } = &ev {
                // Now, not when its rows are released: the pid may be reused by a new child.
                self.bpf.drop_process_probes(*pid);
            }
            match &ev {
                Decoded::Exec {
                    pid, path, stopped, ..
                } => {
                    log::debug(&format!("pid {pid} exec {}", path.display()));
                    self.forget_python(*pid);
                    // A statically linked python has its runtime mapped already.
                    self.configure_python(*pid, true);
                    let planned = self.planner.on_exec(&mut self.bpf, *pid, path);
                    self.resume_if(*stopped, *pid);
                    planned?;
                    self.print_planner_messages();
                }
                Decoded::Open {
                    pid,
                    dfd,
                    path,
                    stopped,
                    ts_mono,
                    tid,
                    path_hash,
                    cgroup,
                    for_writing,
                } => {
                    if let Some(r) = &mut self.stacks {
                        r.invalidate(*pid);
                    }
                    self.kernel_names.invalidate(*pid);
                    // A file being written is planned when a process opens it to load it
                    // (planned now, its half-written contents would pass for the file's).
                    let mut planned = if *for_writing {
                        Ok(())
                    } else {
                        self.planner.on_open(&mut self.bpf, *pid, *dfd, path)
                    };
                    if *stopped && planned.is_ok() {
                        planned = self.planner.plan_ahead_at_stop(&mut self.bpf);
                    }
                    // Python has mapped libpython by the time it opens anything else.
                    self.configure_python(*pid, true);
                    if *stopped {
                        log::debug(&format!(
                            "pid {pid} stopped at open of {} (held {:.2} ms)",
                            path.display(),
                            clock_ns(libc::CLOCK_MONOTONIC).saturating_sub(*ts_mono) as f64 / 1e6
                        ));
                        if !*for_writing {
                            self.bpf
                                .mark_known_path(path.as_os_str().as_encoded_bytes());
                        }
                    }
                    if *stopped && self.bpf.holds.is_some() {
                        // Held, so alive: its mappings so far (the libraries opened before
                        // this one are mapped) serve a short job's stacks after it exits.
                        if let Some(r) = &mut self.stacks {
                            r.snapshot(*pid);
                        }
                        self.release_hold(*pid, *tid, *path_hash, *cgroup, *ts_mono);
                    } else {
                        self.resume_stopped(*stopped, *pid, Some(*tid));
                    }
                    planned?;
                    self.print_planner_messages();
                }
                Decoded::Fork {
                    parent,
                    child,
                    stopped,
                    ..
                } => {
                    log::debug(&format!("pid {parent} started process {child}: traced"));
                    // Per-process probes: the child needs its own before it runs (it is
                    // stopped for this in launch mode).
                    if let Err(e) = self.bpf.scope_process(*child) {
                        log::warn(&format!(
                            "process {child} may be traced incompletely: {e:#}"
                        ));
                    }
                    self.resume_if(*stopped, *child);
                }
                Decoded::Call(CallEvent {
                    pid,
                    call: Call::Exiting { stopped },
                    ..
                }) => {
                    // Held at exit(): the last chance to read its mappings for its stacks.
                    if let Some(r) = &mut self.stacks {
                        r.snapshot(*pid);
                    }
                    self.resume_if(*stopped, *pid);
                }
                Decoded::Call(_) | Decoded::Exit { .. } => {
                    let mut ev = ev;
                    // An exited process's interpreter is forgotten when its exit is applied,
                    // after the calls before it (a batch may reach us after the exit record).
                    if let Decoded::Call(c) = &ev {
                        self.configure_python(c.pid, false);
                    }
                    if let Decoded::Call(CallEvent {
                        pid,
                        call:
                            Call::KernelLaunch {
                                api,
                                kernel,
                                name: name @ None,
                                ..
                            },
                        ..
                    }) = &mut ev
                        && launch_args(*api).is_some_and(|a| a.kernel == KernelRef::Function)
                    {
                        *name = self.kernel_names.name(*pid, *kernel);
                    }
                    self.seq += 1;
                    if let (Some(obs), Decoded::Call(c)) = (&mut self.cfg.observer, &ev) {
                        obs.received(c.pid);
                    }
                    let c = self.stack_job(&ev, raw.ts_ns);
                    let python = self.python_stack_of(&ev, raw.ts_ns);
                    let stacks =
                        (c.is_some() || python.is_some()).then_some(PendingStacks { c, python });
                    self.reorder.push(Pending {
                        seq: self.seq,
                        event: ev,
                        stacks,
                    });
                }
            }
        }
        Ok(())
    }
}
