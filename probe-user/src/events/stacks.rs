//! C call stacks (`--call-stack=c[:D]`): samples from BPF (registers, a frame-pointer walk and
//! a copy of the user stack) are unwound with DWARF CFI and symbolized on a worker thread, so
//! draining the ring buffer never waits for DWARF parsing. Rows wait in the reorder buffer
//! until their stack is ready (see `session/`).

use std::{
    collections::HashMap,
    mem::offset_of,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
        mpsc,
    },
    thread,
};

use crate::events::pystacks::{self, PyStack};
use memscope_symbols::{
    Arch, Frame, ProcessView, Regs, StackSnapshot, StopReason, Symbolizer, UnwindOptions,
    format_stack, unwind,
};
use probe_common::{FP_FRAMES, STACK_COPY_MAX, STACK_HEADER, STACK_KIND, StackEvent};

/// One stack sample as BPF captured it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackSample {
    pub pid: u32,
    pub tid: u32,
    /// The `ts_ns` of the call it was taken for (its record has the same).
    pub ts_ns: u64,
    pub ip: u64,
    pub sp: u64,
    pub fp: u64,
    /// The link register (aarch64; 0 on x86-64).
    pub lr: u64,
    /// The kernel's frame-pointer walk (return addresses, innermost first).
    pub fp_frames: Vec<u64>,
    /// User stack bytes from `sp` on.
    pub stack: Vec<u8>,
}

/// STACK records that carried a copy of the user stack, and the bytes copied in all (the
/// end-of-run summary and `cargo xtask bench --only stacks` read them).
pub static STACK_COPIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub static STACK_COPY_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Counts one sample's stack copy in [`STACK_COPIES`] and [`STACK_COPY_BYTES`].
pub fn count_copy(sample: &StackSample) {
    use std::sync::atomic::Ordering::Relaxed;
    if !sample.stack.is_empty() {
        STACK_COPIES.fetch_add(1, Relaxed);
        STACK_COPY_BYTES.fetch_add(sample.stack.len() as u64, Relaxed);
    }
}

/// The fixed part of a STACK record.
struct StackHead {
    pid: u32,
    tid: u32,
    ts_ns: u64,
    ip: u64,
    sp: u64,
    fp: u64,
    lr: u64,
    frames: Vec<u64>,
}

/// Parses a STACK record; `None` for anything else or a malformed one.
pub fn sample_from_bytes(bytes: &[u8]) -> Option<StackSample> {
    if bytes.len() < STACK_HEADER || u16::from_ne_bytes([bytes[0], bytes[1]]) != STACK_KIND {
        return None;
    }
    // The fields are read where the repr(C) struct puts them (the struct itself holds a
    // 64 KiB stack buffer: no copy of it is made per record).
    let u16_at = |off: usize| u16::from_ne_bytes(bytes[off..off + 2].try_into().unwrap());
    let u32_at = |off: usize| u32::from_ne_bytes(bytes[off..off + 4].try_into().unwrap());
    let u64_at = |off: usize| u64::from_ne_bytes(bytes[off..off + 8].try_into().unwrap());
    let nframes = (u16_at(offset_of!(StackEvent, nframes)) as usize).min(FP_FRAMES + 1);
    let frames_at = offset_of!(StackEvent, frames);
    let stack_len = (u32_at(offset_of!(StackEvent, stack_len)) as usize)
        .min(STACK_COPY_MAX)
        .min(bytes.len() - STACK_HEADER);
    let ev = StackHead {
        pid: u32_at(offset_of!(StackEvent, pid)),
        tid: u32_at(offset_of!(StackEvent, tid)),
        ts_ns: u64_at(offset_of!(StackEvent, ts_ns)),
        ip: u64_at(offset_of!(StackEvent, ip)),
        sp: u64_at(offset_of!(StackEvent, sp)),
        fp: u64_at(offset_of!(StackEvent, fp)),
        lr: u64_at(offset_of!(StackEvent, lr)),
        frames: (0..nframes).map(|i| u64_at(frames_at + 8 * i)).collect(),
    };
    Some(StackSample {
        pid: ev.pid,
        tid: ev.tid,
        ts_ns: ev.ts_ns,
        ip: ev.ip,
        sp: ev.sp,
        fp: ev.fp,
        lr: ev.lr,
        fp_frames: ev.frames,
        stack: bytes[STACK_HEADER..STACK_HEADER + stack_len].to_vec(),
    })
}

struct Job {
    id: u64,
    view: Arc<ProcessView>,
    /// Tells views apart in the worker's cache of stack texts.
    view_id: u64,
    sample: StackSample,
    /// The sample was taken at a function's return: its first pc is a return address too.
    at_return: bool,
    /// `--call-stack=mixed`: the call's Python stack, put in place of the interpreter loop.
    python: Option<Arc<PyStack>>,
}

/// Jobs sent to the worker at once at most (a tight loop with every call sampled).
const SEND_BATCH: usize = 64;

/// The text of a sample whose stack was not unwound because too many bytes of stack copies
/// were already waiting for the worker ([`StackResolver::with_backlog_limit`]).
pub const DROPPED_STACK: &str = "[stack dropped: the unwinder was behind]";

/// The memory a job holds until the worker is done with it.
fn job_bytes(sample: &StackSample) -> usize {
    std::mem::size_of::<Job>() + sample.stack.len() + 8 * sample.fp_frames.len()
}

/// Resolves stacks on a worker thread; results come back by job id.
///
/// Jobs go to the worker in batches, and their texts come back in batches: a channel
/// message and a wakeup of the worker per sample cost the node agent more than the
/// unwinding itself (~10% of its CPU against ~1.5%).
pub struct StackResolver {
    jobs: Option<mpsc::Sender<Vec<Job>>>,
    /// Submitted, not yet sent (ids rising): see [`send_queued`](Self::send_queued).
    queued: Vec<Job>,
    /// [`job_bytes`] of `queued`.
    queued_bytes: usize,
    /// [`job_bytes`] of the jobs sent and not yet unwound (the worker takes its own off).
    waiting: Arc<AtomicUsize>,
    /// Most bytes queued and waiting before a sample's stack is dropped; None: never (the
    /// tracer's runs finish late instead).
    backlog_limit: Option<usize>,
    dropped_text: Arc<str>,
    results: mpsc::Receiver<Vec<(u64, Arc<str>)>>,
    ready: HashMap<u64, Arc<str>>,
    /// Each process's mappings: (view id, view, stale). A stale view (its mappings changed)
    /// is taken anew at the next sample, but still serves once the process is gone: a short
    /// job's samples often reach us after its exit.
    views: HashMap<u32, (u64, Arc<ProcessView>, bool)>,
    next_id: u64,
    next_view_id: u64,
    worker: Option<thread::JoinHandle<()>>,
}

impl StackResolver {
    /// `depth`: most physical frames per stack (`--call-stack=c:D`).
    pub fn new(depth: usize) -> Self {
        let (jobs_tx, jobs_rx) = mpsc::channel::<Vec<Job>>();
        let (res_tx, res_rx) = mpsc::channel();
        let waiting = Arc::new(AtomicUsize::new(0));
        let worker_waiting = waiting.clone();
        let worker = thread::Builder::new()
            .name("memscope-stacks".into())
            .spawn(move || {
                let symbolizer = Symbolizer::new();
                let mut texts = StackTexts::default();
                for jobs in jobs_rx {
                    let done: Vec<(u64, Arc<str>)> = jobs
                        .iter()
                        .map(|job| (job.id, resolve(&symbolizer, &mut texts, job, depth)))
                        .collect();
                    let bytes: usize = jobs.iter().map(|j| job_bytes(&j.sample)).sum();
                    drop(jobs);
                    worker_waiting.fetch_sub(bytes, Ordering::Relaxed);
                    if res_tx.send(done).is_err() {
                        break;
                    }
                }
            })
            .expect("spawn the stack worker");
        StackResolver {
            jobs: Some(jobs_tx),
            queued: Vec::new(),
            queued_bytes: 0,
            waiting,
            backlog_limit: None,
            dropped_text: Arc::from(DROPPED_STACK),
            results: res_rx,
            ready: HashMap::new(),
            views: HashMap::new(),
            next_id: 0,
            next_view_id: 0,
            worker: Some(worker),
        }
    }

    /// Bounds the memory of samples waiting to be unwound (the node agent, which must not grow
    /// without end behind a job that allocates faster than its stacks unwind): past `bytes`,
    /// a sample's text is [`DROPPED_STACK`] at once.
    pub fn with_backlog_limit(mut self, bytes: usize) -> Self {
        self.backlog_limit = Some(bytes);
        self
    }

    /// The process's mappings changed (exec, a library opened): snapshot them anew next time.
    pub fn invalidate(&mut self, pid: u32) {
        if let Some(v) = self.views.get_mut(&pid) {
            v.2 = true;
        }
    }

    /// The process is gone: let its view go, and with it the files it pinned (jobs already
    /// queued hold their own reference). Without this a long-running agent keeps a few
    /// descriptors per exited process forever.
    pub fn forget(&mut self, pid: u32) {
        self.views.remove(&pid);
    }

    /// Snapshots a process's mappings now, while it is held (about to exit, see
    /// `ProbeId::LibcExit`; or the agent's hold at a vendor library's open).
    pub fn snapshot(&mut self, pid: u32) {
        if let Ok(v) = ProcessView::from_pid(pid) {
            v.pin_all();
            self.next_view_id += 1;
            self.views
                .insert(pid, (self.next_view_id, Arc::new(v), false));
        }
    }

    /// Queues a sample (with the call's Python stack for the mixed view); returns the id to
    /// collect its text with. It goes to the worker with the next [`send_queued`]
    /// (Self::send_queued), or when its text is asked for.
    pub fn submit(
        &mut self,
        sample: StackSample,
        at_return: bool,
        python: Option<Arc<PyStack>>,
    ) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let bytes = job_bytes(&sample);
        if let Some(limit) = self.backlog_limit
            && self.waiting.load(Ordering::Relaxed) + self.queued_bytes + bytes > limit
        {
            self.ready.insert(id, self.dropped_text.clone());
            return id;
        }
        let (view_id, view) = match self.views.get(&sample.pid) {
            Some((id, v, false)) if v.lookup(sample.ip).is_some() => (*id, v.clone()),
            known => match ProcessView::from_pid(sample.pid) {
                // An exiting process has no mappings left (its /proc entry stays until it is
                // reaped): the last view that holds the sample's address serves.
                Ok(v)
                    if v.lookup(sample.ip).is_none()
                        && known.is_some_and(|(_, k, _)| k.lookup(sample.ip).is_some()) =>
                {
                    let (id, k, _) = known.expect("checked");
                    (*id, k.clone())
                }
                Ok(v) => {
                    // Taken now, while the process is alive; files are opened (pinned) so
                    // they stay readable after it exits or deletes them.
                    let v = Arc::new(v);
                    v.pin_all();
                    self.next_view_id += 1;
                    self.views
                        .insert(sample.pid, (self.next_view_id, v.clone(), false));
                    (self.next_view_id, v)
                }
                // Gone: the last view taken while it lived, if any.
                Err(_) => match known {
                    Some((id, v, _)) => (*id, v.clone()),
                    None => {
                        self.next_view_id += 1;
                        let v = Arc::new(ProcessView::from_maps_text(""));
                        self.views
                            .insert(sample.pid, (self.next_view_id, v.clone(), true));
                        (self.next_view_id, v)
                    }
                },
            },
        };
        self.queued_bytes += bytes;
        self.queued.push(Job {
            id,
            view,
            view_id,
            sample,
            at_return,
            python,
        });
        if self.queued.len() >= SEND_BATCH {
            self.send_queued();
        }
        id
    }

    /// Sends the queued jobs to the worker (the session does after each drain of the ring).
    pub fn send_queued(&mut self) {
        if self.queued.is_empty() {
            return;
        }
        let jobs = std::mem::take(&mut self.queued);
        let bytes = std::mem::take(&mut self.queued_bytes);
        if let Some(tx) = &self.jobs {
            self.waiting.fetch_add(bytes, Ordering::Relaxed);
            if tx.send(jobs).is_err() {
                self.waiting.fetch_sub(bytes, Ordering::Relaxed);
            }
        }
    }

    /// The text of a finished job, if it is done (non-blocking). A job still queued is sent.
    pub fn take(&mut self, id: u64) -> Option<Arc<str>> {
        if self.queued.first().is_some_and(|j| j.id <= id) {
            self.send_queued();
        }
        while let Ok(done) = self.results.try_recv() {
            self.ready.extend(done);
        }
        self.ready.remove(&id)
    }

    /// The text of a job, waiting for it.
    pub fn wait(&mut self, id: u64) -> Arc<str> {
        if let Some(t) = self.take(id) {
            return t;
        }
        while let Ok(done) = self.results.recv() {
            self.ready.extend(done);
            if let Some(t) = self.ready.remove(&id) {
                return t;
            }
        }
        Arc::from("[truncated]")
    }
}

impl Drop for StackResolver {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// Texts of the stacks resolved so far, by view and return addresses: a process makes the
/// same few stacks over and over (a training loop), and each is formatted once.
#[derive(Default)]
struct StackTexts {
    texts: HashMap<(u64, bool, bool, Vec<u64>), Arc<str>>,
}

/// Frames unwound for the mixed view before its depth is applied (the 8 KiB stack copy ends
/// well before this many).
const MIXED_UNWIND_LIMIT: usize = 1000;

/// Distinct stacks kept before the cache is emptied.
const STACK_TEXTS_LIMIT: usize = 100_000;

/// The sample a probe at the callee's entry would have taken, for a sample taken at a probed
/// call instruction (torch_npu's report call sites): the call made, its return address pushed
/// (x86-64) or in the link register (aarch64), the pc at the callee. So the stack reads the
/// same wherever the probe sits: the callee innermost, then its caller.
fn as_if_called(job: &Job) -> Option<StackSample> {
    let s = &job.sample;
    if job.at_return {
        return None;
    }
    let at = job.view.lookup(s.ip)?;
    let module = at.module()?;
    let target_offset = crate::trace::torch_npu::call_site_target(module.inode, at.file_offset)?;
    let target =
        s.ip.wrapping_add(target_offset.wrapping_sub(at.file_offset));
    // Both in the same mapping of the same file, as code of one object is.
    let callee = job.view.lookup(target)?;
    if callee.file_offset != target_offset
        || callee.module().is_none_or(|m| m.inode != module.inode)
    {
        return None;
    }
    let mut called = s.clone();
    called.ip = target;
    if let Some(first) = called.fp_frames.first_mut() {
        *first = target;
    }
    match Arch::HOST {
        Arch::X86_64 => {
            // `call rel32` is 5 bytes; its return address goes below the stack pointer.
            let ret = s.ip + 5;
            called.sp = s.sp - 8;
            called.stack = ret.to_le_bytes().to_vec();
            called.stack.extend_from_slice(&s.stack);
        }
        Arch::Aarch64 => called.lr = s.ip + 4,
    }
    Some(called)
}

fn resolve(symbolizer: &Symbolizer, texts: &mut StackTexts, job: &Job, depth: usize) -> Arc<str> {
    let called = as_if_called(job);
    let s = called.as_ref().unwrap_or(&job.sample);
    let regs = Regs {
        pc: s.ip,
        sp: s.sp,
        fp: s.fp,
        // The tracer runs on the architecture it traces.
        lr: (Arch::HOST == Arch::Aarch64).then_some(s.lr),
    };
    let snapshot = StackSnapshot {
        base: s.sp,
        data: &s.stack,
    };
    // The mixed view unwinds as far as the copy goes: its Python frames (the program's lines)
    // sit under deep C++ stacks, and the depth must not cut them off (see below).
    let opts = UnwindOptions {
        max_depth: if job.python.is_some() {
            MIXED_UNWIND_LIMIT.max(depth)
        } else {
            depth
        },
        ..Default::default()
    };
    let mut unwound = unwind(&regs, &snapshot, &job.view, symbolizer, &opts);
    // Where CFI unwinding got nowhere but the kernel's frame-pointer walk has more, use it.
    if unwound.pcs.len() <= 1 && s.fp_frames.len() > 1 {
        let mut pcs = s.fp_frames.clone();
        let truncated = pcs.len() > depth;
        pcs.truncate(depth);
        unwound.pcs = pcs;
        unwound.stop = if truncated {
            StopReason::DepthLimit
        } else {
            StopReason::Complete
        };
    }
    let truncated = unwound.truncated();
    let symbolize = |pcs: &[u64]| -> Vec<Frame> {
        pcs.iter()
            .enumerate()
            .flat_map(|(i, pc)| {
                symbolizer
                    .symbolize_shared(&job.view, *pc, i > 0 || job.at_return)
                    .to_vec()
            })
            .collect()
    };
    if let Some(py) = &job.python {
        // `depth` C frames, and more when the interpreter loops running Python frames lie
        // further out: the stack is cut after the last of them, never before.
        let last_loop = unwound.pcs.iter().enumerate().rev().find_map(|(i, pc)| {
            symbolizer
                .symbolize_shared(&job.view, *pc, i > 0 || job.at_return)
                .iter()
                .any(|f| !f.inlined && f.function.as_deref() == Some(pystacks::EVAL_LOOP))
                .then_some(i)
        });
        let keep = last_loop.map_or(depth, |i| depth.max(i + 1));
        let cut = unwound.pcs.len() > keep;
        let pcs = &unwound.pcs[..keep.min(unwound.pcs.len())];
        return Arc::from(pystacks::mix(&symbolize(pcs), py, truncated || cut));
    }
    let key = (job.view_id, job.at_return, truncated, unwound.pcs);
    if let Some(text) = texts.texts.get(&key) {
        return text.clone();
    }
    let text: Arc<str> = Arc::from(format_stack(&symbolize(&key.3), truncated));
    if texts.texts.len() >= STACK_TEXTS_LIMIT {
        texts.texts.clear();
    }
    texts.texts.insert(key, text.clone());
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame-pointer-only sample of this very process at `ip`, with `stack` bytes copied.
    fn own_sample(ip: u64, stack: usize) -> StackSample {
        StackSample {
            pid: std::process::id(),
            tid: 0,
            ts_ns: 0,
            ip,
            sp: 0,
            fp: 0,
            lr: 0,
            fp_frames: vec![],
            stack: vec![0; stack],
        }
    }

    #[test]
    fn parses_a_stack_record_and_rejects_others() {
        let mut ev: StackEvent = unsafe { std::mem::zeroed() };
        ev.kind = STACK_KIND;
        ev.pid = 7;
        ev.tid = 8;
        ev.ip = 0x1000;
        ev.sp = 0x7ff0;
        ev.nframes = 2;
        ev.frames[0] = 0x1000;
        ev.frames[1] = 0x2000;
        ev.stack_len = 16;
        ev.stack[..16].copy_from_slice(&[1u8; 16]);
        let all = unsafe {
            std::slice::from_raw_parts(
                &ev as *const StackEvent as *const u8,
                std::mem::size_of::<StackEvent>(),
            )
        };
        let sent = &all[..STACK_HEADER + 16];
        let s = sample_from_bytes(sent).unwrap();
        assert_eq!((s.pid, s.tid, s.ip, s.sp), (7, 8, 0x1000, 0x7ff0));
        assert_eq!(s.fp_frames, [0x1000, 0x2000]);
        assert_eq!(s.stack, [1u8; 16]);
        assert!(sample_from_bytes(&sent[..10]).is_none());
        let mut other = sent.to_vec();
        other[0] = 1;
        assert!(sample_from_bytes(&other).is_none());
    }

    #[test]
    fn resolves_our_own_stack_through_the_worker() {
        // A frame-pointer-only sample of this very process: the test function's return path.
        let pc = resolves_our_own_stack_through_the_worker as fn() as usize as u64;
        let mut r = StackResolver::new(8);
        let id = r.submit(own_sample(pc, 0), false, None);
        let text = r.wait(id);
        let first = text.lines().next().unwrap();
        assert!(first.starts_with(&format!("0x{pc:016x} ")), "{text}");
        assert!(
            first.contains("resolves_our_own_stack_through_the_worker"),
            "{text}"
        );
    }

    /// With a backlog limit, a sample that would take the bytes queued and waiting past it is
    /// dropped at once (its text [`DROPPED_STACK`]); once the worker is done with the others,
    /// the next one is unwound again.
    #[test]
    fn a_backlog_limit_drops_stacks_past_it_and_recovers() {
        let pc = resolves_our_own_stack_through_the_worker as fn() as usize as u64;
        let sample = || own_sample(pc, STACK_COPY_MAX);
        let each = job_bytes(&sample());
        let mut r = StackResolver::new(8).with_backlog_limit(2 * each);
        let kept = [
            r.submit(sample(), false, None),
            r.submit(sample(), false, None),
        ];
        let dropped = r.submit(sample(), false, None);
        assert_eq!(r.queued.len(), 2, "the third waits for nothing");
        assert_eq!(r.take(dropped).as_deref(), Some(DROPPED_STACK));
        for id in kept {
            let text = r.wait(id);
            assert!(text.starts_with(&format!("0x{pc:016x} ")), "{text}");
        }
        // The worker took its bytes off before sending the texts back.
        assert_eq!(r.waiting.load(Ordering::Relaxed), 0);
        let again = r.submit(sample(), false, None);
        assert_ne!(&*r.wait(again), DROPPED_STACK);
        // Without a limit nothing is dropped, however much waits.
        let mut unbounded = StackResolver::new(8);
        let ids: Vec<u64> = (0..3)
            .map(|_| unbounded.submit(sample(), false, None))
            .collect();
        assert_eq!(unbounded.queued.len(), 3);
        for id in ids {
            assert_ne!(&*unbounded.wait(id), DROPPED_STACK);
        }
    }

    /// Jobs go to the worker in batches: none is lost across the batch size, a job still
    /// queued is sent when its text is asked for, and each text is its own job's.
    #[test]
    fn batched_jobs_each_get_their_own_text() {
        let sample = |ip| own_sample(ip, 0);
        let a = resolves_our_own_stack_through_the_worker as fn() as usize as u64;
        let b = parses_a_stack_record_and_rejects_others as fn() as usize as u64;
        let mut r = StackResolver::new(8);
        let n = 2 * SEND_BATCH as u64 + 3;
        let ids: Vec<(u64, u64)> = (0..n)
            .map(|i| {
                let ip = if i % 3 == 0 { a } else { b };
                (r.submit(sample(ip), false, None), ip)
            })
            .collect();
        assert!(!r.queued.is_empty(), "the tail waits for a send");
        // Asking for a queued job sends it (its text is not there yet, or just arrived).
        let (last, _) = ids[ids.len() - 1];
        let early = r.take(last);
        assert!(r.queued.is_empty());
        for (id, ip) in ids.iter().rev() {
            let text = if *id == last && early.is_some() {
                early.clone().unwrap()
            } else {
                r.wait(*id)
            };
            let first = text.lines().next().unwrap();
            assert!(first.starts_with(&format!("0x{ip:016x} ")), "{id}: {text}");
            let name = if *ip == a {
                "resolves_our_own_stack_through_the_worker"
            } else {
                "parses_a_stack_record_and_rejects_others"
            };
            assert!(first.contains(name), "{id}: {text}");
        }
        assert!(r.ready.is_empty(), "every text was taken once");
    }
}
