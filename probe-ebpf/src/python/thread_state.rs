//! Which `PyThreadState` runs on the current thread: the one remembered for the thread if it
//! still names it and is still listed, else a search of every interpreter's thread list; and
//! a thread found with none, remembered until the interpreter makes another state.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{bpf_probe_read_user, generated::bpf_loop},
    macros::map,
    maps::LruHashMap,
};
use probe_common::{PY_NO_OFFSET, PY_RUNTIME_READ, PY_TSTATE_READ, PyProcess};

use super::{PY_WALK, TSTATE_MASK, WalkScratch, masked_u64, read_u64};

/// tid -> its `PyThreadState`, checked against `native_thread_id` before each use.
#[map]
static PY_THREADS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(16384, 0);

/// tid -> the (only) interpreter's `threads.next_unique_id` when a whole search found no state
/// for the thread. The counter goes up with every state made, so while it stays the thread
/// still has none: a C thread that calls into the library at every operator (torch_npu's task
/// queue) is not searched again at each call.
#[map]
static PY_NO_STATE: LruHashMap<u32, NoState> = LruHashMap::with_max_entries(16384, 0);

/// A thread found without a state: in which process configuration (a thread id reused in
/// another process, whose counter may be at the same number, does not match) and at which
/// count of states made.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
struct NoState {
    generation: u32,
    _pad: u32,
    made: u64,
}

/// Thread-state lookups give up after this many steps (interpreters plus threads).
const FIND_STEPS: u32 = 512;

/// The thread's `PyThreadState`: the cached one if it still names this thread and is still in
/// its interpreter's list (a freed one may still hold the thread's id), else a walk of every
/// interpreter's thread list. 0 when the thread has none.
///
/// `native_thread_id` names the thread that *made* a state, which is not always the one that
/// runs it: `PyThreadState_New` sets it to the calling thread (a state made on one thread for
/// use on another; the state 3.11's and 3.12's `_xxsubinterpreters` make at `create` and run
/// from another thread by `run_string`), and a thread that runs
/// a sub-interpreter has a state in each interpreter. So in 3.11 and 3.12 the state that runs
/// on this thread is the one whose `cframe` (on the C stack of the innermost interpreter loop
/// running that state's code) is lowest on this thread's stack: between the stack pointer and
/// the thread's own state's `cframe` (which is on this stack), whichever thread made it. 3.13
/// has no such pointer; its sub-interpreters make a state per `exec` on the running thread,
/// put at the head of their interpreter, newer interpreters first: the first state of the
/// thread with frames is taken.
/// Only a thread with one state, found unambiguous, is cached.
///
/// A subprogram of its own: its locals stay out of the frame under which the frame walk's
/// steps run (the deepest chain of BPF stack).
#[inline(never)]
pub(super) fn find_thread_state(scratch: *mut WalkScratch, tid: u32, sp: u64) -> u64 {
    unsafe { (*scratch).tstate_at = 0 };
    let p = unsafe { &(*scratch).p };
    // `head` and `main` side by side (`PyProcess::interpreters_head`): one read, and several
    // interpreters run when they differ. With them, where the version has it, the state of
    // the thread holding the GIL (3.11).
    let Some((interp, main, current)) = read_runtime(scratch) else {
        return 0;
    };
    let several = interp != 0 && interp != main;
    if !several {
        if let Some(t) = unsafe { PY_THREADS.get(&tid) } {
            let t = *t;
            // Its fields from one copy: the per-read cost of the kernel's user copy is most of
            // a short walk's.
            let s = unsafe { &mut *scratch };
            let rc = unsafe {
                aya_ebpf::helpers::generated::bpf_probe_read_user(
                    s.tstate.as_mut_ptr() as *mut c_void,
                    PY_TSTATE_READ as u32,
                    t as *const c_void,
                )
            };
            // The GIL holder's state is live: no need to check that it is still listed.
            if rc == 0
                && tstate_u64(s, s.p.tstate_native_thread_id) == tid as u64
                && (t == current || still_listed(&s.p, interp, t, tstate_u64(s, s.p.tstate_prev)))
            {
                s.tstate_at = t;
                return t;
            }
        }
    }
    // `next_unique_id` is the field before `threads.head` in 3.11 to 3.13 (`struct pythreads`),
    // read before the search: a state made during it changes it, and the next call searches.
    let made = if several {
        None
    } else {
        read_u64(
            interp
                .wrapping_add(p.interp_threads_head as u64)
                .wrapping_sub(8),
        )
        .map(|made| NoState {
            generation: p.generation,
            _pad: 0,
            made,
        })
    };
    if let Some(made) = made
        && unsafe { PY_NO_STATE.get(&tid) }.copied() == Some(made)
    {
        return 0;
    }
    unsafe {
        (*scratch).find = ThreadFind {
            interp,
            tstate: 0,
            tid: tid as u64,
            sp,
            found: 0,
            matches: 0,
            several: several as u64,
            first_running: 0,
            home_anchor: u64::MAX,
            low: 0,
            low_anchor: u64::MAX,
        };
        bpf_loop(
            FIND_STEPS,
            find_step as *mut c_void,
            core::ptr::null_mut(),
            0,
        )
    };
    let find = unsafe { &(*scratch).find };
    let chosen = find.choice(p);
    if !several && find.matches == 1 && chosen == find.found {
        let _ = PY_THREADS.insert(&tid, &chosen, 0);
    } else {
        let _ = PY_THREADS.remove(&tid);
    }
    // Only a search that went through the whole list (not cut by `FIND_STEPS`) proves none.
    if let Some(made) = made
        && chosen == 0
        && find.matches == 0
        && find.interp == 0
        && find.tstate == 0
    {
        let _ = PY_NO_STATE.insert(&tid, &made, 0);
    }
    chosen
}

/// `_PyRuntime`'s `interpreters.head` and `.main`, and `gilstate.tstate_current` where
/// `PyProcess::tstate_current` says (else 0): one copy from `head` to it.
#[inline(always)]
fn read_runtime(scratch: *mut WalkScratch) -> Option<(u64, u64, u64)> {
    let s = unsafe { &mut *scratch };
    let head_at = s.p.runtime + s.p.interpreters_head as u64;
    let span = (s.p.tstate_current as u64 + 8).wrapping_sub(s.p.interpreters_head as u64);
    if s.p.tstate_current == PY_NO_OFFSET || span < 16 || span >= PY_RUNTIME_READ as u64 {
        let [head, main] = unsafe { bpf_probe_read_user(head_at as *const [u64; 2]) }.ok()?;
        return Some((head, main, 0));
    }
    // Masked as well, through a volatile read so that the compiler keeps the mask it would
    // prove useless: kernels before 6.13 lose the bound of the comparison above on the way to
    // the helper's size ("R2 min value is negative", seen on 6.12).
    let len = unsafe { core::ptr::read_volatile(&span) } as u32 & (PY_RUNTIME_READ as u32 - 1);
    let rc = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            s.runtime.as_mut_ptr() as *mut c_void,
            len,
            head_at as *const c_void,
        )
    };
    if rc != 0 {
        return None;
    }
    let words = s.runtime.as_ptr();
    Some((
        masked_u64(words, 0, PY_RUNTIME_READ - 1),
        masked_u64(words, 8, PY_RUNTIME_READ - 1),
        masked_u64(words, span as u32 - 8, PY_RUNTIME_READ - 1),
    ))
}

/// Whether thread state `t` is still linked in the (only) interpreter's list `interp`: its
/// `prev` names it as `next`, or it is the head. A freed state is not (the allocator writes its
/// free-list links over `prev` and `next`).
#[inline(always)]
fn still_listed(p: &PyProcess, interp: u64, t: u64, prev: u64) -> bool {
    match prev {
        0 => read_u64(interp + p.interp_threads_head as u64) == Some(t),
        prev => read_u64(prev + p.tstate_next as u64) == Some(t),
    }
}

/// The u64 at `off` in the copy of a thread state.
#[inline(always)]
pub(super) fn tstate_u64(s: &WalkScratch, off: u32) -> u64 {
    masked_u64(s.tstate.as_ptr(), off, TSTATE_MASK)
}

/// The thread-state search's state (in `PY_WALK`).
#[repr(C)]
pub(super) struct ThreadFind {
    /// The next interpreter to list (0: none left).
    interp: u64,
    /// The thread state to look at next (0: take the next interpreter's list).
    tstate: u64,
    tid: u64,
    /// The stack pointer at the probe.
    sp: u64,
    /// The first state that names the thread, and how many do.
    found: u64,
    matches: u64,
    /// Several interpreters are alive.
    several: u64,
    /// 3.13: the first state of the thread with a current frame.
    first_running: u64,
    /// 3.11, 3.12: the lowest `cframe` at or above `sp` among the states that name the thread,
    /// and the state with the lowest `cframe` at or above `sp` of all.
    home_anchor: u64,
    low: u64,
    low_anchor: u64,
}

impl ThreadFind {
    /// Weighs one thread state (see [`find_thread_state`]).
    #[inline(always)]
    fn consider(&mut self, p: &PyProcess, tstate: u64) {
        let mine = read_u64(tstate + p.tstate_native_thread_id as u64) == Some(self.tid);
        if mine {
            if self.found == 0 {
                self.found = tstate;
            }
            self.matches += 1;
        }
        let Some(frame) = read_u64(tstate + p.tstate_frame as u64) else {
            return;
        };
        if frame == 0 {
            return;
        }
        if p.cframe_current_frame == PY_NO_OFFSET {
            // 3.13: the order of the walk decides.
            if mine && self.first_running == 0 {
                self.first_running = tstate;
            }
            return;
        }
        // 3.11, 3.12: `frame` is the `cframe`; a state that runs no code points it at the
        // `root_cframe` inside itself, with no current frame.
        let anchor = frame;
        if anchor < self.sp {
            return;
        }
        match read_u64(anchor + p.cframe_current_frame as u64) {
            Some(current) if current != 0 => {}
            _ => return,
        }
        if mine && anchor < self.home_anchor {
            self.home_anchor = anchor;
        }
        if anchor < self.low_anchor {
            self.low = tstate;
            self.low_anchor = anchor;
        }
    }

    /// The state that runs on the thread (else the first that names it: it runs nothing).
    #[inline(always)]
    fn choice(&self, p: &PyProcess) -> u64 {
        if p.cframe_current_frame != PY_NO_OFFSET {
            // `low` is at or below the thread's own state's `cframe`: on this stack.
            if self.home_anchor != u64::MAX && self.low_anchor <= self.home_anchor {
                return self.low;
            }
            return self.found;
        }
        if self.first_running != 0 {
            self.first_running
        } else {
            self.found
        }
    }
}

#[inline(never)]
extern "C" fn find_step(_index: u32, _ctx: *mut c_void) -> i64 {
    let Some(scratch) = PY_WALK.get_ptr_mut(0) else {
        return 1;
    };
    let (p, f) = unsafe { (&(*scratch).p, &mut (*scratch).find) };
    if f.tstate == 0 {
        if f.interp == 0 {
            return 1;
        }
        f.tstate = read_u64(f.interp + p.interp_threads_head as u64).unwrap_or(0);
        f.interp = read_u64(f.interp + p.interp_next as u64).unwrap_or(0);
        return 0;
    }
    let t = f.tstate;
    f.consider(p, t);
    f.tstate = read_u64(t + p.tstate_next as u64).unwrap_or(0);
    0
}
