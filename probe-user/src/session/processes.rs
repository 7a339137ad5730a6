//! Traced processes coming and going: their state, output and, when one ends, its leaks,
//! analyses and files.

use super::{REORDER_WINDOW_NS, Session, Traced, clock_ns};
use crate::events::decode::Decoded;
use crate::log;
use crate::output::ProcessOutput;
use crate::output::leaks;
use crate::output::leaks::{LeakCause, ProcessLeaks};
use crate::output::snapshot::SnapshotRecorder;
use crate::state::ProcessState;
use anyhow::Result;

impl Session {
    /// Applies held events older than the reorder window (all of them when `all`).
    pub(super) fn release(&mut self, all: bool) -> Result<()> {
        // Calls may still wait in a CPU's batch if they are dated after the last flush.
        let horizon = clock_ns(libc::CLOCK_MONOTONIC)
            .saturating_sub(REORDER_WINDOW_NS)
            .min(self.flushed_at);
        while let Some((ts, _)) = self.reorder.first_key() {
            if !all && ts > horizon {
                break;
            }
            // A row waits for its stack: rows stay in time order, draining goes on meanwhile.
            if let Some(top) = self.reorder.peek_mut()
                && let Some(stacks) = &mut top.stacks
                && let Some((job, text)) = &mut stacks.c
                && text.is_none()
                && let Some(resolver) = &mut self.stacks
            {
                *text = if all {
                    Some(resolver.wait(*job))
                } else {
                    resolver.take(*job)
                };
                if text.is_none() {
                    break;
                }
            }
            let p = self.reorder.pop().expect("peeked");
            let (c_stack, py_stack) = match p.stacks {
                Some(s) => (s.c.and_then(|(_, text)| text), s.python),
                None => (None, None),
            };
            match p.event {
                Decoded::Call(call) => {
                    let ts = (call.ts_mono as i128 + self.realtime_offset).max(0) as u64;
                    let track = self.cfg.track;
                    let mut rows = std::mem::take(&mut self.rows);
                    self.traced(call.pid);
                    let traced = self.procs.get_mut(&call.pid).expect("just made");
                    if call.ts_mono < traced.applied_ts {
                        self.late += 1;
                    } else {
                        traced.applied_ts = call.ts_mono;
                    }
                    traced.state.set_python_stack(py_stack);
                    traced
                        .state
                        .apply_into(&call, ts, &track, c_stack, &mut rows);
                    for m in traced.state.messages.drain(..) {
                        log::debug(&m);
                    }
                    if let Some(obs) = &mut self.cfg.observer {
                        obs.applied(&traced.state, &rows);
                    } else {
                        traced.write_rows(ts, &rows);
                    }
                    rows.clear();
                    self.rows = rows;
                }
                Decoded::Exit { pid, .. } => {
                    // Every call of the process before its exit has been decoded by now (the
                    // exit leaves the reorder window after them), its stacks submitted with
                    // the view they need: the view, and the files it pinned, can go.
                    if let Some(r) = &mut self.stacks {
                        r.forget(pid);
                    }
                    self.kernel_names.forget(pid);
                    self.finish_process(pid, LeakCause::Exited);
                    self.forget_python(pid);
                }
                _ => {}
            }
        }
        Ok(())
    }

    pub(super) fn traced(&mut self, pid: u32) -> &mut Traced {
        if !self.procs.contains_key(&pid) {
            self.order.push(pid);
        }
        let cfg = &self.cfg;
        self.procs.entry(pid).or_insert_with(|| {
            let mut out = ProcessOutput::with_format(
                &cfg.output_dir,
                pid,
                cfg.config_json.clone(),
                cfg.format,
            );
            if let Some((bytes, files)) = cfg.rotate {
                out.rotate(bytes, files);
            }
            let mut state = ProcessState::new(pid);
            use crate::trace::mindspore::BeforeAttach;
            match cfg.driver_before.filter(|&(p, _)| p == pid) {
                Some((_, BeforeAttach::VmmMapped(bytes))) => state.driver_before = bytes,
                Some((_, BeforeAttach::NoVmm)) => state.pool_reserved_unseen = true,
                None => {}
            }
            Traced {
                state,
                out,
                finished: false,
                applied_ts: 0,
                later_rows: Vec::new(),
                // Launch mode sees the process from its start; --pid joins it running.
                snapshot: cfg
                    .snapshot
                    .then(|| SnapshotRecorder::new(cfg.child.is_none())),
            }
        })
    }

    /// A process is gone (or we are detaching): write its leak report and flush its files.
    pub(super) fn finish_process(&mut self, pid: u32, cause: LeakCause) {
        let Some(t) = self.procs.get_mut(&pid) else {
            return;
        };
        if t.finished {
            return;
        }
        t.finished = true;
        if let Some(obs) = &mut self.cfg.observer {
            // Memory stays bounded whatever the churn: the observer keeps a summary.
            obs.finished(&t.state);
            self.procs.remove(&pid);
            self.order.retain(|p| *p != pid);
            return;
        }
        let held = std::mem::take(&mut t.later_rows);
        t.write_rows(u64::MAX, &held);
        for row in t.state.finish_atb(&self.cfg.track) {
            if let Err(e) = t.out.write(row) {
                log::error(&format!("{e:#}"));
            }
        }
        let memory = t.state.exit_memory();
        let mut files = Vec::new();
        if self.cfg.leaks && !(memory.tensor_leaks.is_empty() && memory.driver_leaks.is_empty()) {
            match leaks::write_leak_files(&mut t.out, pid, &memory, cause) {
                Ok(f) => files = f,
                Err(e) => {
                    log::error(&format!("cannot write the leak report of pid {pid}: {e:#}"));
                    t.out.note_failure(&e);
                }
            }
        }
        if self.cfg.track.inefficient {
            let flagged = t.state.inefficient_blocks();
            if !flagged.is_empty() {
                let mut per_type = std::collections::BTreeMap::<&str, usize>::new();
                for (_, types) in &flagged {
                    for ty in types.split(',') {
                        *per_type.entry(ty).or_default() += 1;
                    }
                }
                let counts: Vec<String> =
                    per_type.iter().map(|(k, v)| format!("{k} {v}")).collect();
                log::info(&format!(
                    "pid {pid}: inefficient memory: {} block(s): {}",
                    flagged.len(),
                    counts.join(", ")
                ));
                if let Err(e) = write_inefficient_csv(&mut t.out, pid, &flagged) {
                    log::error(&format!(
                        "cannot write the inefficient report of pid {pid}: {e:#}"
                    ));
                    t.out.note_failure(&e);
                }
            }
        }
        if self.cfg.track.decompose && !t.state.decompose.is_empty() {
            match t.state.decompose.write_csv(&mut t.out) {
                Ok(path) => {
                    log::info(&format!(
                        "pid {pid}: memory by owner (decompose), per step in {}",
                        path.display()
                    ));
                    for line in t.state.decompose.report().lines() {
                        log::info(&format!("  {line}"));
                    }
                }
                Err(e) => {
                    log::error(&format!(
                        "cannot write the decompose report of pid {pid}: {e:#}"
                    ));
                    t.out.note_failure(&e);
                }
            }
        }
        t.write_snapshot(pid, "memory_snapshot");
        if let Err(e) = t.out.finish() {
            log::error(&format!("{e:#}"));
        }
        if self.cfg.leaks {
            let pool_report = t.state.pool_report();
            self.leaks.push(ProcessLeaks {
                pid,
                cause,
                memory,
                files,
                pool_report,
            });
        }
    }
}

/// `inefficient_<ts>.csv` in the process directory: every flagged block, with its types.
pub(super) fn write_inefficient_csv(
    out: &mut ProcessOutput,
    pid: u32,
    flagged: &[(u64, String)],
) -> Result<()> {
    use std::io::Write;
    let dir = out.ensure_dir()?;
    let (_, f) = dir.create_unique_file(
        &format!("inefficient_{}", crate::output::local_timestamp()),
        ".csv",
    )?;
    let mut f = std::io::BufWriter::new(f);
    writeln!(f, "Process Id,Allocation Id,Inefficient Type")?;
    for (id, types) in flagged {
        writeln!(f, "{pid},{id},\"{types}\"")?;
    }
    f.flush()?;
    Ok(())
}
