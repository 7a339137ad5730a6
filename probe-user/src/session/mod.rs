//! The tracing session: drains the ring buffer, keeps probes attached as libraries appear,
//! turns events into rows in time order, and ends when the traced tree is gone or on a signal.
//!
//! The run loop that wires the stages: `trace` (attach as libraries appear) -> `events`
//! (decode, stacks) -> `state` (per process) -> `output` and `analysis` (when a process
//! ends). Files: `records` (one ring-buffer record at a time), `call_stacks` (C and Python
//! stacks joined to their call), `processes` (processes coming and going).
//!
//! Uses every stage above (`trace`, `events`, `state`, `analysis`, `output`), `settings`
//! and `log`; used by `main` and `agent` only.

mod call_stacks;
mod processes;
mod records;
mod reorder;

use crate::events::decode;
use crate::events::decode::{CallEvent, Decoded};
use crate::events::kernels::KernelNames;
use crate::events::pystacks::{PyStack, PyStacks};
use crate::events::stacks::{StackResolver, StackSample};
use crate::log;
use crate::output::leaks::{LeakCause, ProcessLeaks};
use crate::output::snapshot::SnapshotRecorder;
use crate::output::{ProcessOutput, Row};
use crate::settings::DataFormat;
use crate::state::{AddrHash, ProcessState, ProcessStats, TrackOptions};
use crate::trace::attach::Planner;
use crate::trace::bpf::{Bpf, Counters};
use crate::trace::holders::Taken;
use crate::trace::launch;
use crate::trace::target::process_alive;
use anyhow::Result;
use aya::maps::{MapData, RingBuf};
use probe_common::RawEvent;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::signal::unix::{SignalKind, signal};

/// Events are held this long before being applied, so events from different CPUs (and a free
/// racing with the reuse of its address) are applied in the order they took effect.
const REORDER_WINDOW_NS: u64 = 50_000_000;
const TICK: Duration = Duration::from_millis(100);
/// How often the CPUs' batches of finished calls are sent (see `Bpf::flush_call_batches`):
/// well inside the reorder window. A flush costs a syscall and an interrupt per CPU (~5 us),
/// so hosts with many CPUs flush less often; order never suffers (events wait for a flush),
/// only latency.
fn flush_every(cpus: usize) -> Duration {
    Duration::from_millis((20 * cpus.div_ceil(16)).clamp(20, 250) as u64)
}
const MAPS_RESCAN: Duration = Duration::from_millis(500);
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

pub struct SessionConfig {
    pub output_dir: PathBuf,
    pub config_json: String,
    /// `--format`: CSV files or SQLite databases (committed on every flush).
    pub format: DataFormat,
    pub track: TrackOptions,
    pub leaks: bool,
    /// (pid, what): the driver memory the process attached to held before the attach.
    pub driver_before: Option<(u32, crate::trace::mindspore::BeforeAttach)>,
    /// Launch mode: our direct child, whose exit status we return.
    pub child: Option<u32>,
    /// `--call-stack=c:D`: resolve C stacks up to D frames.
    pub stack_depth: Option<usize>,
    /// `--call-stack=python`: Python stacks (of processes already found to run CPython).
    pub python: Option<PyStacks>,
    /// `--call-stack=mixed`: the C column shows the Python frames in place of the loop.
    pub mixed: bool,
    /// `--max-file-mib` (in bytes) and `--max-files`: rotating CSV dumps.
    pub rotate: Option<(u64, Option<u32>)>,
    /// The node agent (`agent/`): sees every process's state instead of files being written,
    /// runs until a signal, and lets exited processes go.
    pub observer: Option<Box<dyn Observer>>,
    /// `--memory-snapshot`: keep each process's PyTorch memory snapshot, written when it ends and
    /// on SIGUSR1.
    pub snapshot: bool,
}

/// Most bytes of sampled stacks the node agent keeps waiting for its unwinder (at 64 KiB a
/// copy, ~1,000 samples, ~55 ms of unwinding): a job that allocates faster than its stacks
/// unwind grew the agent to 1.7 GB in 20 s before, ~560 MB with this bound, ring buffer
/// included (benchmark-notes.md, session 16).
const AGENT_STACK_BACKLOG: usize = 64 << 20;

/// What a long-running consumer of the tracked state (the node agent) hooks into the session.
/// With an observer no files are written and the session ends only on a signal.
pub trait Observer {
    /// A call of process `pid` arrived (before the reorder window): the process may still be
    /// there to look at.
    fn received(&mut self, pid: u32);
    /// Whether to resolve the C stack of this call (sampling); unresolved calls carry none.
    fn wants_stack(&mut self, call: &CallEvent) -> bool;
    /// The rows one call produced in process `state.pid` (not written anywhere else).
    fn applied(&mut self, state: &ProcessState, rows: &[Row]);
    /// Every tick, with the state of every live process and the session's event counts.
    fn tick(&mut self, states: &mut dyn Iterator<Item = &ProcessState>, events: u64, lost: u64);
    /// The process exited (or the session ends); its state is dropped after this.
    fn finished(&mut self, state: &ProcessState);
    /// The agent's hold of process `pid` at a vendor library's open ends after `held_ns`
    /// (`trace::hold`), the process still stopped unless `by_watchdog` (the watchdog had
    /// continued it: the agent was frozen).
    fn held(&mut self, _pid: u32, _held_ns: u64, _by_watchdog: bool) {}
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    TargetExited,
    Signal(i32),
}

pub struct SessionResult {
    pub end: EndReason,
    pub child_status: Option<i32>,
    pub processes: Vec<(u32, ProcessStats, u64, PathBuf)>,
    pub leaks: Vec<ProcessLeaks>,
    pub counters: Counters,
    pub events: u64,
    /// What could not be written, over all processes.
    pub write_loss: crate::output::csv::WriteLoss,
    /// The loaded programs, still attached: `Bpf::detach_in_background` once output is done.
    pub bpf: Bpf,
}

/// An event in the reorder window. Kept small (120 bytes): the node agent holds ~5000 of
/// them, written and read back once each.
struct Pending {
    seq: u64,
    event: Decoded,
    /// Its stacks, when it has any. Not boxed: the reorder window holds 50 ms of records,
    /// and reading each one's box back as it left the window was a cache miss per record
    /// (~6% of the tracer's CPU with `--call-stack=python`).
    stacks: Option<PendingStacks>,
}

struct PendingStacks {
    /// The stack job of this call, and its text once resolved.
    c: Option<(u64, Option<Arc<str>>)>,
    /// Its Python stack (resolved when the sample arrived).
    python: Option<Arc<str>>,
}

impl reorder::Ordered for Pending {
    fn key(&self) -> (u64, u64) {
        (self.event.ts_mono(), self.seq)
    }
}

/// A Python stack waiting for its call: the call's `ts_ns`, the stack's text, and its frames
/// for the mixed view.
#[derive(Clone)]
struct PendingPython {
    ts_ns: u64,
    text: Arc<str>,
    frames: Option<Arc<PyStack>>,
}

struct Traced {
    state: ProcessState,
    out: ProcessOutput,
    finished: bool,
    /// The newest event time applied to this process (CLOCK_MONOTONIC ns).
    applied_ts: u64,
    /// Rows dated after the call that made them (an operator's end row, made at its start's
    /// turn), sorted by time: written once the calls before them are.
    later_rows: Vec<Row>,
    /// `--memory-snapshot`: the memory snapshot built from the rows written.
    snapshot: Option<SnapshotRecorder>,
}

impl Traced {
    /// Writes the rows of a call applied at `now` (realtime ns), keeping the file in time
    /// order: rows dated later wait until a later call's turn (or the process's end).
    fn write_rows(&mut self, now: u64, rows: &[Row]) {
        let due = self.later_rows.partition_point(|r| r.ts_ns <= now);
        for row in self.later_rows.drain(..due) {
            if let Some(s) = &mut self.snapshot {
                s.row(&row);
            }
            if let Err(e) = self.out.write_ref(&row) {
                log::error(&format!("{e:#}"));
            }
        }
        for row in rows {
            if row.ts_ns > now {
                let at = self.later_rows.partition_point(|r| r.ts_ns <= row.ts_ns);
                self.later_rows.insert(at, row.clone());
                continue;
            }
            if let Some(s) = &mut self.snapshot {
                s.row(row);
            }
            if let Err(e) = self.out.write_ref(row) {
                log::error(&format!("{e:#}"));
            }
        }
    }

    /// Writes the memory snapshot as it stands (`--memory-snapshot`), if a pool block was seen.
    fn write_snapshot(&mut self, pid: u32, stem: &str) {
        let Some(s) = &self.snapshot else {
            return;
        };
        if !s.has_pool() {
            log::info(&format!(
                "pid {pid}: no memory snapshot: no framework pool block seen (yet)"
            ));
            return;
        }
        match s.write(&mut self.out, stem) {
            Ok((path, size)) => log::info(&format!(
                "pid {pid}: memory snapshot {} ({})",
                path.display(),
                crate::output::leaks::human_bytes(size)
            )),
            Err(e) => {
                log::error(&format!(
                    "cannot write the memory snapshot of pid {pid}: {e:#}"
                ));
                self.out.note_failure(&e);
            }
        }
    }
}

pub struct Session {
    bpf: Bpf,
    planner: Planner,
    cfg: SessionConfig,
    procs: HashMap<u32, Traced, AddrHash>,
    order: Vec<u32>,
    reorder: reorder::Reorder<Pending>,
    /// The rows of the event being applied; kept to reuse its allocation.
    rows: Vec<Row>,
    seq: u64,
    events: u64,
    realtime_offset: i128,
    leaks: Vec<ProcessLeaks>,
    reported: Counters,
    child_status: Option<i32>,
    stacks: Option<StackResolver>,
    pending_stacks: HashMap<u32, StackSample, AddrHash>,
    /// `--call-stack=python`: processes' interpreters and code objects.
    python: Option<PyStacks>,
    /// Thread -> the Python stack BPF sent for one of its calls (already resolved; the
    /// frames too for the mixed view), until that call comes.
    pending_py: HashMap<u32, PendingPython, AddrHash>,
    kernel_names: KernelNames,
    /// CLOCK_MONOTONIC when the last complete flush of the CPUs' call batches began: every
    /// call dated before it has reached the ring buffer.
    flushed_at: u64,
    /// Events applied after a later one of the same process (they reached us after the reorder
    /// window had let it through): their rows are out of time order. And how many of them were
    /// already reported.
    late: u64,
    late_reported: u64,
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Session {
    pub fn new(bpf: Bpf, planner: Planner, mut cfg: SessionConfig) -> Self {
        let stack_depth = cfg.stack_depth;
        let agent = cfg.observer.is_some();
        let python = cfg.python.take();
        let realtime_offset =
            clock_ns(libc::CLOCK_REALTIME) as i128 - clock_ns(libc::CLOCK_MONOTONIC) as i128;
        Session {
            bpf,
            planner,
            cfg,
            procs: HashMap::default(),
            order: Vec::new(),
            reorder: reorder::Reorder::new(),
            rows: Vec::new(),
            seq: 0,
            events: 0,
            realtime_offset,
            leaks: Vec::new(),
            reported: Counters::default(),
            child_status: None,
            stacks: stack_depth.map(|depth| {
                let resolver = StackResolver::new(depth);
                // The node agent runs on: what waits for the unwinder stays bounded.
                if agent {
                    resolver.with_backlog_limit(AGENT_STACK_BACKLOG)
                } else {
                    resolver
                }
            }),
            pending_stacks: HashMap::default(),
            python,
            pending_py: HashMap::default(),
            kernel_names: KernelNames::default(),
            flushed_at: 0,
            late: 0,
            late_reported: 0,
        }
    }

    /// SIGUSR1: each live process's memory snapshot as it stands now (rows up to the reorder
    /// window before the signal), in `memory_snapshot_<time>.pickle`.
    fn snapshot_now(&mut self) -> Result<()> {
        if !self.cfg.snapshot {
            log::warn("received SIGUSR1: no memory snapshot is kept; run with --memory-snapshot");
            return Ok(());
        }
        self.release(false)?;
        let stem = format!("memory_snapshot_{}", crate::output::local_timestamp());
        for pid in self.order.clone() {
            if let Some(t) = self.procs.get_mut(&pid)
                && !t.finished
            {
                t.write_snapshot(pid, &stem);
            }
        }
        Ok(())
    }

    pub async fn run(mut self, ring: RingBuf<MapData>) -> Result<SessionResult> {
        raise_consumer_priority();
        // SAFETY: the ring buffer owns its fd and outlives the registration (both are dropped here).
        let mut ring = unsafe { AsyncFd::register(ring)? };
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut sigterm = signal(SignalKind::terminate())?;
        // A closed terminal (an SSH session that drops) ends the run as Ctrl-C does: detach,
        // write what was collected, not die with nothing written.
        let mut sighup = signal(SignalKind::hangup())?;
        // SIGUSR1 writes each live process's memory snapshot now (`--memory-snapshot`); without it
        // the signal is only noted, never the default action (which would end the tracer).
        let mut sigusr1 = signal(SignalKind::user_defined1())?;
        let mut tick = tokio::time::interval(TICK);
        let mut flush_tick = tokio::time::interval(flush_every(self.bpf.cpu_count()));
        flush_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_rescan = Instant::now();
        let mut last_progress = Instant::now();
        let written = match self.bpf.written_files_fd() {
            // SAFETY: the registration owns the descriptor and is dropped with it.
            Some(fd) => Some(unsafe { AsyncFd::register(fd)? }),
            None => None,
        };
        let end = loop {
            tokio::select! {
                guard = readable(&written) => {
                    if let Ok(mut guard) = guard {
                        guard.clear_ready();
                    }
                    self.files_written();
                    self.print_planner_messages();
                }
                guard = ring.readable_mut() => {
                    let mut guard = guard?;
                    // Cleared before reading, not after: a record whose wakeup came between
                    // the last read and the clear would wait for the next tick (20 ms), and
                    // with it a process stopped for us (seen: the 200-object start-up at a
                    // steady 27 ms instead of 12).
                    guard.clear_ready();
                    self.drain(guard.get_inner_mut())?;
                    self.plan_later(guard.get_inner_mut())?;
                    self.release(false)?;
                }
                _ = flush_tick.tick() => {
                    self.flush_batches();
                    self.drain(ring.get_mut())?;
                    self.plan_later(ring.get_mut())?;
                    self.release(false)?;
                }
                _ = tick.tick() => {
                    self.drain(ring.get_mut())?;
                    self.release(false)?;
                    self.housekeeping();
                    if let Some(obs) = &mut self.cfg.observer {
                        let mut live = self.procs.values().filter(|t| !t.finished).map(|t| &t.state);
                        obs.tick(&mut live, self.events, self.reported.lost_events());
                    }
                    if last_rescan.elapsed() >= MAPS_RESCAN {
                        last_rescan = Instant::now();
                        // The agent traces every process: rescan only those using the libraries.
                        let pids = if self.cfg.observer.is_some() {
                            self.procs.keys().copied().collect()
                        } else {
                            self.bpf.traced_processes()
                        };
                        for pid in pids {
                            self.planner.scan_maps(&mut self.bpf, pid, &mut Vec::new())?;
                            self.configure_python(pid, true);
                        }
                        self.print_planner_messages();
                    }
                    if last_progress.elapsed() >= PROGRESS_EVERY {
                        last_progress = Instant::now();
                        log::info(&format!(
                            "tracing {} process(es): {} events so far, {} lost",
                            self.bpf.traced_processes().len(),
                            self.events,
                            self.reported.lost_events()
                        ));
                    }
                    if self.cfg.observer.is_none() && self.tree_gone() {
                        break EndReason::TargetExited;
                    }
                }
                _ = sigint.recv() => break EndReason::Signal(libc::SIGINT),
                _ = sigterm.recv() => break EndReason::Signal(libc::SIGTERM),
                _ = sighup.recv() => break EndReason::Signal(libc::SIGHUP),
                _ = sigusr1.recv() => self.snapshot_now()?,
            }
        };
        if let EndReason::Signal(sig) = end {
            log::info(&format!(
                "received {}: detaching and writing what was collected",
                match sig {
                    libc::SIGINT => "SIGINT",
                    libc::SIGHUP => "SIGHUP",
                    _ => "SIGTERM",
                }
            ));
            // Stop the BPF side from producing more, then take what is already queued.
            for pid in self.bpf.traced_processes() {
                self.bpf.forget_process(pid);
            }
        }
        // The final drain handles (and so resumes) every process the BPF side stopped.
        let still_traced = self.bpf.traced_processes();
        self.flush_batches();
        let drained = self.drain(ring.get_mut());
        // Belt and braces: whatever happened above, nothing we stopped may stay stopped. Only
        // launch mode stops processes (a `--pid` session continuing one would undo someone
        // else's stop: a job stopped by its user, or held by the agent), and what another
        // tracer holds at an open is that tracer's to continue.
        let launched = self.cfg.child.is_some();
        for pid in still_traced {
            if !launched || self.bpf.holders.registry.held_by_others(pid) {
                continue;
            }
            // SAFETY: plain kill(2); a no-op for a process that is not stopped.
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        }
        drained?;
        self.release(true)?;
        self.housekeeping();
        let cause = match end {
            EndReason::TargetExited => LeakCause::Exited,
            EndReason::Signal(_) => LeakCause::Detached,
        };
        let pids: Vec<u32> = self.order.clone();
        for pid in pids {
            self.finish_process(pid, cause);
        }
        let processes = self
            .order
            .iter()
            .filter_map(|pid| self.procs.get(pid))
            .map(|t| {
                (
                    t.state.pid,
                    t.state.stats,
                    t.out.rows_written(),
                    t.out.process_dir().to_path_buf(),
                )
            })
            .collect();
        let mut write_loss = crate::output::csv::WriteLoss::default();
        for t in self.procs.values() {
            write_loss.add(t.out.loss());
        }
        Ok(SessionResult {
            write_loss,
            end,
            child_status: self.child_status,
            processes,
            leaks: std::mem::take(&mut self.leaks),
            counters: self.bpf.counters(),
            events: self.events,
            bpf: self.bpf,
        })
    }

    /// The traced tree is gone: no traced process left, and our direct child reaped.
    fn tree_gone(&mut self) -> bool {
        if let Some(child) = self.cfg.child
            && self.child_status.is_none()
        {
            self.child_status = launch::reap_children(child);
        } else if self.cfg.child.is_some() {
            launch::reap_children(0);
        }
        let traced = self.bpf.traced_processes();
        // Processes that vanished without an exit event (should not happen, but a stale entry
        // must never keep us running forever).
        for pid in &traced {
            if !process_alive(*pid) {
                self.bpf.forget_process(*pid);
            }
        }
        let child_done = self.cfg.child.is_none() || self.child_status.is_some();
        self.bpf.traced_processes().is_empty() && child_done
    }

    /// Has every CPU send its batch of finished calls; see `flushed_at`.
    fn flush_batches(&mut self) {
        let started = clock_ns(libc::CLOCK_MONOTONIC);
        if self.bpf.flush_call_batches() {
            self.flushed_at = started;
        }
    }

    fn drain(&mut self, ring: &mut RingBuf<MapData>) -> Result<()> {
        while let Some(item) = ring.next() {
            if let Some(mut calls) = decode::batch_calls(&item) {
                // One event for the whole batch: each call overwrites what it has.
                let mut raw = RawEvent::zeroed();
                while calls.next_into(&mut raw) {
                    self.handle_raw(&raw)?;
                }
                continue;
            }
            self.handle_record(&item)?;
        }
        // The stacks of this drain's samples, to the worker in one go.
        if let Some(r) = &mut self.stacks {
            r.send_queued();
        }
        Ok(())
    }

    /// Plans what the planner left for later (a directory's other shared objects, queued at a
    /// stop) one object at a time while no record waits, reading the ring as soon as one does:
    /// a process stopped meanwhile (it opened one of them before its turn) waits for at most
    /// one object.
    ///
    /// The planning runs at the target's priority, not at our raised one: the target just
    /// resumed, and the scheduler tends to wake it on our CPU, where the raised priority held
    /// it off for the whole plan (a 0.6 ms stop cost it 3-9 ms). Lower (nice 10) lost every
    /// race to the target on a busy machine: it stopped at each object in turn. The ring is
    /// read at the raised priority.
    fn plan_later(&mut self, ring: &mut RingBuf<MapData>) -> Result<()> {
        if !self.planner.has_later() {
            return Ok(());
        }
        // Only where our priority can be raised back (CAP_SYS_NICE).
        let lower = consumer_nice() == CONSUMER_NICE;
        if lower {
            set_consumer_nice(BACKGROUND_NICE);
        }
        // A process just resumed is often queued on our CPU: let it run first (the other CPU
        // may take us meanwhile) rather than after our time slice (seen: the target waiting
        // ~2 ms, the whole plan of a directory found in the cache).
        // SAFETY: no preconditions.
        unsafe { libc::sched_yield() };
        while self.planner.has_later() {
            let planned = loop {
                if let Err(e) = self.planner.plan_next(&mut self.bpf) {
                    break Err(e);
                }
                if !self.planner.has_later() || records_wait(ring) {
                    break Ok(());
                }
            };
            if lower {
                set_consumer_nice(CONSUMER_NICE);
            }
            planned?;
            self.drain(ring)?;
            if lower && self.planner.has_later() {
                set_consumer_nice(BACKGROUND_NICE);
            }
        }
        self.print_planner_messages();
        Ok(())
    }

    /// Watched files written in place lost their probes (`trace::bpf` `changes.rs`): the
    /// planner forgets them, so the next open or mapping of each plans it anew.
    fn files_written(&mut self) {
        let written = self.bpf.drop_written_files();
        if let Some(holds) = &mut self.bpf.holds
            && !written.is_empty()
        {
            holds.forget_cleared();
        }
        for file in written {
            self.planner.forget_file(&mut self.bpf, file.inode);
            if file.links == 0 {
                log::debug(&format!(
                    "{} was written to: planned again at its next open or mapping",
                    file.path.display()
                ));
                continue;
            }
            log::warn(&format!(
                "{} was written to while probed: its probes are removed ({} link(s); the \
                 kernel would run the old file's instructions at them in every process that \
                 maps the new one); it is probed again at its next open or mapping",
                file.path.display(),
                file.links
            ));
        }
    }

    /// The agent's hold of `pid` (thread `tid`) at an open is over: its probes are in place.
    /// Continues it unless the watchdog did, or another tracer still holds it (`trace::hold`).
    fn release_hold(&mut self, pid: u32, tid: u32, path_hash: u64, cgroup: u64, ts_mono: u64) {
        let Some(holds) = &mut self.bpf.holds else {
            return;
        };
        let taken = holds.release(&self.bpf.holders.registry, tid, path_hash, cgroup);
        let by_watchdog = taken == Taken::NotHeld;
        let held_ns = clock_ns(libc::CLOCK_MONOTONIC).saturating_sub(ts_mono);
        // Before it goes on: the observer reads what it needs of the process (its name).
        if let Some(obs) = &mut self.cfg.observer {
            obs.held(pid, held_ns, by_watchdog);
        }
        if let Taken::Last(pid) = taken {
            // SAFETY: plain kill(2); a process that is gone makes it fail harmlessly.
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        }
        log::debug(&format!(
            "pid {pid} held at a vendor library's open for {:.2} ms, released by {}",
            held_ns as f64 / 1e6,
            match taken {
                Taken::Last(_) => "the agent",
                Taken::OthersHold => "the agent, another tracer still holding it",
                Taken::NotHeld => "the watchdog",
            }
        ));
    }

    /// Continues a process the BPF side stopped for us (see `STOPPED`); a stop at an open
    /// (`at_open`) is also another tracer's to end, if it holds the process too.
    fn resume_if(&mut self, stopped: bool, pid: u32) {
        self.resume_stopped(stopped, pid, None);
    }

    fn resume_stopped(&mut self, stopped: bool, pid: u32, at_open: Option<u32>) {
        if !stopped {
            return;
        }
        // Not recorded (or released by our watchdog): continued as before the registry.
        let taken = at_open.map_or(Taken::NotHeld, |tid| self.bpf.holders.registry.take(tid));
        if taken == Taken::OthersHold {
            log::debug(&format!(
                "pid {pid}: our probes are in place; another tracer still holds it"
            ));
            return;
        }
        log::debug(&format!("pid {pid} resumed after attaching"));
        // SAFETY: plain kill(2); a process that is gone makes it fail harmlessly.
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    }

    fn housekeeping(&mut self) {
        for t in self.procs.values_mut().filter(|t| !t.finished) {
            if let Err(e) = t.out.flush() {
                log::error(&format!("{e:#}"));
            }
        }
        let now = self.bpf.counters();
        let lost_ring = now.ringbuf_full - self.reported.ringbuf_full;
        let lost_pending = now.pending_full - self.reported.pending_full;
        if lost_ring > 0 {
            log::warn(&format!(
                "lost {lost_ring} event(s): the ring buffer was full (try a larger --ring-buffer-mib)"
            ));
        }
        let lost_batch = now.batch_dropped - self.reported.batch_dropped;
        if lost_batch > 0 {
            log::warn(&format!(
                "lost {lost_batch} mstx memory region(s): a batch larger than one call can report"
            ));
        }
        if lost_pending > 0 {
            log::warn(&format!(
                "lost {lost_pending} call(s): too many calls in flight at once"
            ));
        }
        self.reported = now;
        if self.late > self.late_reported {
            log::warn(&format!(
                "{} event(s) reached the tracer more than {} ms after they happened (a call \
                 that long, or the tracer held off the CPU): their rows are written after \
                 later ones of the same process",
                self.late - self.late_reported,
                REORDER_WINDOW_NS / 1_000_000
            ));
            self.late_reported = self.late;
        }
    }

    fn print_planner_messages(&mut self) {
        for w in self.planner.warnings.drain(..) {
            log::warn(&w);
        }
        for d in self.planner.debug.drain(..) {
            log::debug(&d);
        }
    }
}

/// The ring-buffer consumer must keep up even when the target's threads keep every CPU busy
/// (4 spinning threads on 2 CPUs left it a fifth of a CPU and the ring overflowed): raise this
/// thread's CFS weight (nice -10, ~9x a nice-0 thread). Per thread on Linux, so the target,
/// already forked, keeps its own priority. Best effort: without CAP_SYS_NICE nothing changes.
fn raise_consumer_priority() {
    if !set_consumer_nice(CONSUMER_NICE) {
        log::debug("could not raise the ring consumer's priority (needs CAP_SYS_NICE)");
    }
}

const CONSUMER_NICE: libc::c_int = -10;
/// While planning in the background (`Session::plan_later`): the target's own.
const BACKGROUND_NICE: libc::c_int = 0;

/// Waits until `fd` is readable; never, without one.
async fn readable(
    fd: &Option<AsyncFd<std::os::fd::OwnedFd>>,
) -> std::io::Result<tokio::io::unix::AsyncFdReadyGuard<'_, std::os::fd::OwnedFd>> {
    match fd {
        Some(fd) => fd.readable().await,
        None => std::future::pending().await,
    }
}

/// Whether records wait in the ring (any: the poll looks at the data, not at wakeups).
fn records_wait(ring: &RingBuf<MapData>) -> bool {
    use std::os::fd::AsRawFd;
    let mut fd = libc::pollfd {
        fd: ring.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no timeout.
    unsafe { libc::poll(&mut fd, 1, 0) > 0 }
}

/// The calling thread's nice value (on Linux, `PRIO_PROCESS` with `who` 0 is the calling
/// thread: nice values are per thread).
fn consumer_nice() -> libc::c_int {
    // SAFETY: a plain syscall on the calling thread.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }
}

/// Sets the calling thread's nice value; false when refused.
fn set_consumer_nice(nice: libc::c_int) -> bool {
    // SAFETY: a plain syscall on the calling thread.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_interval_grows_with_the_cpus_and_stays_bounded() {
        let ms = |cpus| flush_every(cpus).as_millis();
        assert_eq!(ms(1), 20);
        assert_eq!(ms(16), 20);
        assert_eq!(ms(17), 40);
        assert_eq!(ms(192), 240);
        assert_eq!(ms(4096), 250);
    }
}
