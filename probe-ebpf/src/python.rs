//! Python stacks (`--call-stack=python`): at a traced call of a process that runs CPython,
//! find the calling thread's `PyThreadState` (the interpreters' thread lists, matched by
//! `native_thread_id`, cached per thread while one interpreter runs) and send its
//! `_PyInterpreterFrame` chain: each frame's code object and instruction pointer. A code
//! object seen for the first time in a process is sent whole before the stack (names, first
//! line, line table: [`PyCodeEvent`]), so that user space never reads one that may be freed by
//! then. The thread is inside the probe, so its own chain
//! cannot change while it is read; a failed read or a chain that loops is still flagged, never
//! followed further.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user, generated::bpf_loop},
    macros::{map, uprobe},
    maps::{Array, HashMap, LruHashMap, PerCpuArray},
    programs::ProbeContext,
};
use probe_common::{
    PY_CODE_FILE, PY_CODE_HEADER, PY_CODE_NAME, PY_CODE_TABLE, PY_FRAME_HAS_IDS, PY_FRAME_READ,
    PY_MAX_FRAMES, PY_NO_OFFSET, PY_RUNTIME_READ, PY_STACK_HEADER, PY_TSTATE_READ, PYCODE_KIND,
    PYSTACK_KIND, PyCodeEvent, PyFrameRecord, PyProcess, PyStackEvent, counter, py_code_flags,
    py_code_ids, py_flags,
};

use crate::{
    emit::BPF_RB_NO_WAKEUP,
    maps::{EVENTS, bump, offsets},
};

mod thread_state;
use thread_state::{ThreadFind, find_thread_state, tstate_u64};

/// pid -> where its interpreter keeps threads and frames (written by user space).
#[map]
static PY_PROCS: HashMap<u32, PyProcess> = HashMap::with_max_entries(4096, 0);

#[map]
static PY_SCRATCH: PerCpuArray<PyStackEvent> = PerCpuArray::with_max_entries(1, 0);

/// A code object already sent to user space ([`PyCodeEvent`]): process (and its
/// configuration's generation), address and identity.
#[repr(C)]
#[derive(Clone, Copy)]
struct CodeKey {
    tgid: u32,
    generation: u32,
    code: u64,
    ids: u64,
}

#[map]
static PY_CODES_SENT: LruHashMap<CodeKey, u8> = LruHashMap::with_max_entries(65536, 0);

/// A code object already sent: process (and configuration), address, identity, and the count
/// of code objects freed ([`PY_CODE_DEATHS`]) before its identity was read.
#[repr(C)]
#[derive(Clone, Copy)]
struct LiveCode {
    tgid: u32,
    generation: u32,
    code: u64,
    ids: u64,
    deaths: u64,
}

const LIVE_SLOTS: u32 = 1024;

/// Code objects already sent, by address, with their identity: while no code object of a traced
/// process has been freed since a slot was filled (`py_code_gone` counts them, on the
/// interpreter's `code_dealloc`), the object at that address is still the one read then, and
/// a frame naming it needs no read of its identity. Only filled for processes whose
/// `code_dealloc` is probed (`PyProcess::code_gone`). Direct-mapped per CPU (a slot keeps the
/// last code object hashed to it), so looking it up at every frame is a few instructions, not
/// a hash map's lookup.
#[map]
static PY_CODES_LIVE: PerCpuArray<LiveCode> = PerCpuArray::with_max_entries(LIVE_SLOTS, 0);

/// How many code objects traced processes have freed.
#[map]
static PY_CODE_DEATHS: Array<u64> = Array::with_max_entries(1, 0);

#[inline(always)]
fn live_slot(tgid: u32, code: u64) -> u32 {
    ((code >> 4) ^ (code >> 14) ^ tgid as u64) as u32 & (LIVE_SLOTS - 1)
}

/// The identity of code object `code` of the walk's process if a slot knows it still.
#[inline(always)]
fn live_ids(buf: &WalkScratch, code: u64) -> Option<u64> {
    let slot = unsafe { &*PY_CODES_LIVE.get_ptr(live_slot(buf.walk.tgid, code))? };
    (slot.code == code
        && slot.tgid == buf.walk.tgid
        && slot.generation == buf.p.generation
        && slot.deaths == buf.walk.deaths)
        .then_some(slot.ids)
}

/// Fills `code`'s slot (looked up again rather than kept across the identity's read and
/// `send_code`: the step's BPF stack is the deepest chain's).
#[inline(always)]
fn remember_live(buf: &WalkScratch, code: u64, ids: u64) {
    if let Some(slot) = PY_CODES_LIVE.get_ptr_mut(live_slot(buf.walk.tgid, code)) {
        // Field by field: a struct literal is built on the BPF stack first.
        let slot = unsafe { &mut *slot };
        slot.tgid = buf.walk.tgid;
        slot.generation = buf.p.generation;
        slot.code = code;
        slot.ids = ids;
        slot.deaths = buf.walk.deaths;
    }
}

#[map]
static PY_CODE_SCRATCH: PerCpuArray<PyCodeEvent> = PerCpuArray::with_max_entries(1, 0);

/// Everything the walk's `bpf_loop` steps share: the process's layout (a copy of its
/// `PY_PROCS` entry), the steps' states and one frame's bytes. Here and not on the BPF stack,
/// whose 512 bytes cover the whole chain of calls, probe program -> `emit_python_stack` ->
/// step -> `send_code` (kernels before 6.13 refuse more; `trace::bpf::stack_budget` in user
/// space checks it). So the loops get no context pointer: each step looks this up.
#[repr(C)]
struct WalkScratch {
    p: PyProcess,
    /// The process whose layout `p` is.
    p_pid: u32,
    find: ThreadFind,
    walk: FrameWalk,
    loops: LoopWalk,
    /// The bytes of user memory `walk.window_at..walk.window_end`: the frame being walked and
    /// what lies below it (`FRAME_WINDOW`), with room past them for a masked field offset.
    window: [u64; (FRAME_WINDOW + PY_FRAME_READ) / 8],
    /// The first `PY_TSTATE_READ` bytes of the thread state `tstate_at` (0: none read), from
    /// the check of a cached one; room past them for a masked offset.
    tstate: [u64; TSTATE_MASK / 8 + 1],
    /// `_PyRuntime` from `interpreters.head` on (see `thread_state::read_runtime`); room past
    /// it for a masked offset.
    runtime: [u64; PY_RUNTIME_READ / 8 + 1],
    tstate_at: u64,
    /// The frame's code object: its identity words and its key in `PY_CODES_SENT`.
    words: [u64; 4],
    key: CodeKey,
}

#[map]
static PY_WALK: PerCpuArray<WalkScratch> = PerCpuArray::with_max_entries(1, 0);

/// Frames are read a window at a time: the frame and up to this many bytes below it, never
/// below the frame's own 4 KiB (mapped, as the frame is). A frame's callers lie just below
/// it on the thread's data stack, so one read takes the frames of a page instead of one read
/// each: the kernel's user copy costs ~90 ns a read here whatever its size, most of a walk.
const FRAME_WINDOW: usize = 2048;
const WINDOW_PAGE: u64 = 4096;
/// Frame field offsets are masked with this, and a frame's place in the window with
/// `FRAME_WINDOW - 1`: a masked offset plus 8 stays inside the window's buffer.
const FIELD_MASK: usize = 127;
const _: () = assert!(PY_FRAME_READ <= FIELD_MASK + 1);
const _: () = assert!(FRAME_WINDOW.is_power_of_two() && FRAME_WINDOW as u64 <= WINDOW_PAGE);

/// Thread-state field offsets are masked with this (user space keeps them within
/// `PY_TSTATE_READ`).
const TSTATE_MASK: usize = 255;
const _: () = assert!(PY_TSTATE_READ <= TSTATE_MASK + 1);

#[inline(always)]
fn read_u64(addr: u64) -> Option<u64> {
    unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
}

/// True when Python stacks are on and `tgid` runs a CPython user space told us about: only
/// then does a call need to leave the per-CPU batch for its stack.
#[inline(always)]
pub fn runs_python(tgid: u32) -> bool {
    offsets().python_stacks != 0 && unsafe { PY_PROCS.get(&tgid) }.is_some()
}

/// Where on the current thread's C stack the outermost interpreter loop running the Python
/// frames just sent keeps its state (an address above the stack pointer; 0: none found), left
/// here by [`emit_python_stack`] for the C stack copy that follows, which reaches past it.
#[map]
pub(crate) static PY_LOOP_AT: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Sends the Python stack of the current thread if its process runs a known CPython, and
/// when `find_loops` asks, leaves where its interpreter loops are in [`PY_LOOP_AT`].
#[inline(never)]
pub fn emit_python_stack(tgid: u32, tid: u32, ts_ns: u64, sp: u64, find_loops: bool) {
    if let Some(slot) = PY_LOOP_AT.get_ptr_mut(0) {
        unsafe { *slot = 0 };
    }
    let loop_at = walk_python_stack(tgid, tid, ts_ns, sp, find_loops);
    if let Some(slot) = PY_LOOP_AT.get_ptr_mut(0) {
        unsafe { *slot = loop_at };
    }
}

#[inline(always)]
fn walk_python_stack(tgid: u32, tid: u32, ts_ns: u64, sp: u64, find_loops: bool) -> u64 {
    if offsets().python_stacks == 0 {
        return 0;
    }
    let Some(proc_) = (unsafe { PY_PROCS.get(&tgid) }) else {
        return 0;
    };
    let Some(scratch) = PY_WALK.get_ptr_mut(0) else {
        return 0;
    };
    // Through the raw pointer: the loop steps change the walk's states behind our back (the
    // layout `p` stays as copied here). Copied only when this CPU last walked another process
    // or configuration (generations are never reused): the copy is a byte loop in BPF.
    unsafe {
        if (*scratch).p_pid != tgid || (*scratch).p.generation != proc_.generation {
            (*scratch).p = *proc_;
            (*scratch).p_pid = tgid;
        }
    };
    let p = unsafe { &(*scratch).p };
    let Some(ev) = PY_SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    let ev = unsafe { &mut *ev };
    ev.kind = PYSTACK_KIND;
    ev.flags = 0;
    ev.nframes = 0;
    ev.pid = tgid;
    ev.tid = tid;
    ev.ts_ns = ts_ns;
    ev.tstate = find_thread_state(scratch, tid, sp);
    if ev.tstate == 0 {
        ev.flags |= py_flags::NO_THREAD_STATE;
        output(ev, 0);
        return 0;
    }
    // The frame pointer is in the copy of a cached thread state; a searched one is read.
    let top = if unsafe { (*scratch).tstate_at } == ev.tstate {
        Some(tstate_u64(unsafe { &*scratch }, p.tstate_frame))
    } else {
        read_u64(ev.tstate + p.tstate_frame as u64)
    };
    let first = match top {
        Some(f) if p.cframe_current_frame == PY_NO_OFFSET => Some(f),
        Some(cframe) if cframe != 0 => read_u64(cframe + p.cframe_current_frame as u64),
        Some(_) => Some(0),
        None => None,
    };
    let Some(first) = first else {
        ev.flags |= py_flags::READ_FAULT;
        output(ev, 0);
        return 0;
    };
    unsafe {
        // Field by field, the zeros as single stores: a struct literal's run of zeros becomes
        // a `memset` call, a loop of byte stores on BPF. An empty window (`window_end` 0) is
        // read at the first frame; `window_at` and `base` are set with it.
        let w = &mut (*scratch).walk;
        // Before any code object's identity is read (see `PY_CODES_LIVE`).
        w.deaths = PY_CODE_DEATHS
            .get_ptr(0)
            .map(|d| core::ptr::read_volatile(d))
            .unwrap_or(0);
        w.frame = first;
        w.tgid = tgid;
        w.find_loops = find_loops as u32;
        core::ptr::write_volatile(&mut w.n, 0);
        core::ptr::write_volatile(&mut w.last_entry, 0);
        core::ptr::write_volatile(&mut w.window_end, 0);
        bpf_loop(
            PY_MAX_FRAMES as u32 + 1,
            frame_step as *mut c_void,
            core::ptr::null_mut(),
            0,
        )
    };
    let n = unsafe { core::ptr::read_volatile(&(*scratch).walk.n) };
    let n = n as usize & (2 * PY_MAX_FRAMES - 1);
    let n = if n > PY_MAX_FRAMES { PY_MAX_FRAMES } else { n };
    ev.nframes = n as u16;
    output(ev, n);
    if !find_loops {
        return 0;
    }
    // The loops are found in the walks without comparing addresses there: a comparison in a
    // `bpf_loop` callback ties its iterations' states together and the verifier can no longer
    // prune them. Whether the address is on this stack is decided here, once.
    let outermost = match top {
        // 3.11, 3.12: each interpreter loop keeps its `_PyCFrame` on its own C stack frame,
        // linked outwards by `previous` (which follows `current_frame` in both) to the thread
        // state's `root_cframe` (in the heap), whose `previous` is NULL: the outermost loop's
        // is the one before it.
        Some(cframe) if p.cframe_current_frame != PY_NO_OFFSET => unsafe {
            // (Single stores, as the walk's above.)
            let l = &mut (*scratch).loops;
            l.cframe = cframe;
            l.previous = p.cframe_current_frame as u64 + 8;
            core::ptr::write_volatile(&mut l.before_last, 0);
            core::ptr::write_volatile(&mut l.last, 0);
            bpf_loop(
                PY_MAX_FRAMES as u32,
                loop_step as *mut c_void,
                core::ptr::null_mut(),
                0,
            );
            core::ptr::read_volatile(&(*scratch).loops.before_last)
        },
        // 3.13: each loop's entry frame is on its C stack; the walk goes outwards.
        _ => unsafe { core::ptr::read_volatile(&(*scratch).walk.last_entry) },
    };
    if outermost > sp { outermost } else { 0 }
}

#[repr(C)]
struct LoopWalk {
    cframe: u64,
    previous: u64,
    /// The last two `_PyCFrame`s of the chain.
    before_last: u64,
    last: u64,
}

/// One `_PyCFrame` of the chain. Returns 1 to stop.
#[inline(never)]
extern "C" fn loop_step(_index: u32, _ctx: *mut c_void) -> i64 {
    let Some(scratch) = PY_WALK.get_ptr_mut(0) else {
        return 1;
    };
    let w = unsafe { &mut (*scratch).loops };
    if w.cframe == 0 {
        return 1;
    }
    w.before_last = w.last;
    w.last = w.cframe;
    match read_u64(w.cframe + w.previous) {
        Some(previous) => {
            w.cframe = previous;
            0
        }
        None => 1,
    }
}

#[inline(always)]
fn output(ev: &PyStackEvent, frames: usize) {
    let len = PY_STACK_HEADER + frames * core::mem::size_of::<PyFrameRecord>();
    let bytes = unsafe { core::slice::from_raw_parts(ev as *const PyStackEvent as *const u8, len) };
    // The call event that follows decides whether to wake user space.
    if EVENTS.output::<[u8]>(bytes, BPF_RB_NO_WAKEUP).is_err() {
        bump(counter::RINGBUF_FULL);
    }
}

/// The frame walk's state (in `PY_WALK`).
#[repr(C)]
struct FrameWalk {
    frame: u64,
    n: u32,
    tgid: u32,
    /// 3.13: the last entry frame of an interpreter loop seen (on the C stack).
    last_entry: u64,
    find_loops: u32,
    /// The user addresses whose bytes `WalkScratch::window` holds (none at first).
    window_at: u64,
    window_end: u64,
    /// Where the current frame starts in the window (kept here, not in a local: the step's
    /// BPF stack is shared with `send_code` below it).
    base: u64,
    /// `PY_CODE_DEATHS` at the walk's start.
    deaths: u64,
}

/// `_PyInterpreterFrame.owner` of an interpreter loop's entry frame (3.12+: on its C stack).
const FRAME_OWNED_BY_CSTACK: u64 = 3;

/// The u64 at `off` in the current frame's bytes (masked into the buffer whatever user space
/// wrote; a frame's fields end before `PY_FRAME_READ`, so a real one is never cut).
#[inline(always)]
fn field_u64(buf: &WalkScratch, off: u32) -> u64 {
    masked_u64(buf.window.as_ptr(), field_at(buf, off), FRAME_WINDOW - 1)
}

/// Where field `off` of the current frame lies in the window.
#[inline(always)]
fn field_at(buf: &WalkScratch, off: u32) -> u32 {
    (buf.walk.base as u32 + (off & FIELD_MASK as u32)) & (FRAME_WINDOW as u32 - 1)
}

/// The u64 at byte `off & mask` of `words`, a buffer of at least `mask / 8 + 1` words: the
/// mask keeps a field offset from user space inside it, for the verifier and for us. Pointer
/// fields are 8-aligned in every layout, so the read is one aligned load (an unaligned one is
/// eight byte loads on BPF, for every field of every frame).
#[inline(always)]
fn masked_u64(words: *const u64, off: u32, mask: usize) -> u64 {
    unsafe { *words.add((off as usize & mask) / 8) }
}

#[inline(always)]
fn field_u8(buf: &WalkScratch, off: u32) -> u64 {
    unsafe { *(buf.window.as_ptr() as *const u8).add(field_at(buf, off) as usize) as u64 }
}

/// Makes the window hold the frame at `frame` (read with what lies below it on its page,
/// unless it already does) and points `walk.base` at it. False when it cannot be read.
#[inline(always)]
fn window_over(buf: &mut WalkScratch, frame: u64) -> bool {
    let end = frame.wrapping_add(PY_FRAME_READ as u64);
    if frame < buf.walk.window_at || end > buf.walk.window_end || end < frame {
        let page = frame & !(WINDOW_PAGE - 1);
        let at = if end.wrapping_sub(page) > FRAME_WINDOW as u64 {
            end.wrapping_sub(FRAME_WINDOW as u64)
        } else {
            page
        };
        let len = end.wrapping_sub(at);
        if len == 0 || len > FRAME_WINDOW as u64 {
            return false;
        }
        let rc = unsafe {
            aya_ebpf::helpers::generated::bpf_probe_read_user(
                buf.window.as_mut_ptr() as *mut c_void,
                len as u32,
                at as *const c_void,
            )
        };
        if rc != 0 {
            buf.walk.window_end = 0;
            return false;
        }
        buf.walk.window_at = at;
        buf.walk.window_end = end;
    }
    buf.walk.base = (frame - buf.walk.window_at) & (FRAME_WINDOW as u64 - 1);
    true
}

/// One frame of the walk: records it and moves to `previous`. Returns 1 to stop.
///
/// Frame `index` goes to slot `index` (each step records one frame or stops). The slot and
/// the depth cut use the loop's index, never a count kept in `FrameWalk`: a count is a known
/// constant in each step the verifier checks, so no two steps look alike and it walked all
/// of them, each with every path through `send_code` (9-17 s to load the programs with
/// Python stacks on, under load). The index is an unknown number to it: one step is enough.
#[inline(never)]
extern "C" fn frame_step(index: u32, _ctx: *mut c_void) -> i64 {
    let Some(buf) = PY_WALK.get_ptr_mut(0) else {
        return 1;
    };
    let buf = unsafe { &mut *buf };
    if buf.walk.frame == 0 {
        return 1;
    }
    let Some(ev) = PY_SCRATCH.get_ptr_mut(0) else {
        return 1;
    };
    let ev = unsafe { &mut *ev };
    // `python_stacks` is the depth asked for: frames past it are not read at all (the
    // default, the program's own line, needs the innermost few).
    let max = offsets().python_stacks as usize;
    if index as usize >= PY_MAX_FRAMES || index as usize >= max {
        ev.flags |= py_flags::TRUNCATED;
        return 1;
    }
    if !window_over(buf, buf.walk.frame) {
        ev.flags |= py_flags::READ_FAULT;
        return 1;
    }
    let previous = field_u64(buf, buf.p.frame_previous);
    let mut meta = field_u8(buf, buf.p.frame_owner);
    if buf.p.frame_is_entry != PY_NO_OFFSET && field_u8(buf, buf.p.frame_is_entry) != 0 {
        meta |= 1 << 8;
    }
    if buf.walk.find_loops != 0 && meta & 0xff == FRAME_OWNED_BY_CSTACK {
        buf.walk.last_entry = buf.walk.frame;
    }
    let code = field_u64(buf, buf.p.frame_code);
    // The code object's identity now: it may be freed before user space reads it.
    let known = if code != 0 && buf.p.code_gone != 0 {
        live_ids(buf, code)
    } else {
        None
    };
    if let Some(ids) = known {
        meta |= PY_FRAME_HAS_IDS | (ids << 32);
    } else if buf.p.code_ids != PY_NO_OFFSET && code != 0 {
        let at = code.wrapping_add(buf.p.code_ids as u64);
        // Read into the scratch map, not onto the BPF stack (`WalkScratch`).
        let rc = unsafe {
            aya_ebpf::helpers::generated::bpf_probe_read_user(
                buf.words.as_mut_ptr() as *mut c_void,
                core::mem::size_of_val(&buf.words) as u32,
                at as *const c_void,
            )
        };
        if rc == 0 {
            let ids = py_code_ids(buf.words);
            meta |= PY_FRAME_HAS_IDS | (ids << 32);
            buf.key = CodeKey {
                tgid: buf.walk.tgid,
                generation: buf.p.generation,
                code,
                ids,
            };
            let sent = unsafe { PY_CODES_SENT.get(&buf.key) }.is_some()
                || send_code(&buf.p, &buf.key, &buf.words);
            if sent && buf.p.code_gone != 0 {
                remember_live(buf, code, ids);
            }
        }
    }
    let slot = &mut ev.frames[index as usize & (PY_MAX_FRAMES - 1)];
    slot.code = code;
    slot.instr = field_u64(buf, buf.p.frame_instr);
    slot.meta = meta;
    buf.walk.n = index + 1;
    // Frames live on the thread's data stack (callers below callees) or in generator objects;
    // a frame that is its own caller would loop.
    if previous == buf.walk.frame {
        ev.flags |= py_flags::CHAIN_LOOP;
        return 1;
    }
    buf.walk.frame = previous;
    0
}

/// At the interpreter's `code_dealloc` of a traced process: a code object is being freed, so
/// every slot of [`PY_CODES_LIVE`] filled before now is stale (its address may be reused). The
/// count goes up before the memory is freed, so before any object can be made there; and a
/// frame holds a strong reference to its code object, so the one a walk reads while its thread
/// is stopped in the probe cannot be freed during the walk.
#[uprobe]
pub fn py_code_gone(_ctx: ProbeContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if unsafe { PY_PROCS.get(&tgid) }.is_none() {
        return 0;
    }
    if let Some(deaths) = PY_CODE_DEATHS.get_ptr_mut(0) {
        // A plain `xadd` (see `process::add_children_waiting`).
        unsafe {
            core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
                deaths, 1,
            )
        };
    }
    0
}

/// Sends a code object seen for the first time ([`PyCodeEvent`]), and remembers it once the
/// record is in the ring buffer (a record lost to a full buffer is sent again next time).
/// `words`: its `co_filename`, `co_name`, `co_qualname` and `co_linetable` pointers.
#[inline(never)]
fn send_code(p: &PyProcess, key: &CodeKey, words: &[u64; 4]) -> bool {
    let Some(ev) = PY_CODE_SCRATCH.get_ptr_mut(0) else {
        return false;
    };
    let ev = unsafe { &mut *ev };
    ev.kind = PYCODE_KIND;
    ev.flags = 0;
    ev.pid = key.tgid;
    ev.code = key.code;
    ev.ids = key.ids;
    ev.firstlineno = unsafe {
        bpf_probe_read_user(key.code.wrapping_add(p.code_firstlineno as u64) as *const i32)
    }
    .unwrap_or(0);
    let (len, kind) = read_name(
        p,
        words[0],
        ev.file.as_mut_ptr(),
        PY_CODE_FILE,
        &mut ev.flags,
    );
    ev.file_len = len;
    ev.file_kind = kind;
    let (len, kind) = read_name(
        p,
        words[1],
        ev.name.as_mut_ptr(),
        PY_CODE_NAME,
        &mut ev.flags,
    );
    ev.name_len = len;
    ev.name_kind = kind;
    let (len, kind) = read_name(
        p,
        words[2],
        ev.qualname.as_mut_ptr(),
        PY_CODE_NAME,
        &mut ev.flags,
    );
    ev.qualname_len = len;
    ev.qualname_kind = kind;
    // A `bytes` object: `ob_size` at 16, the bytes from 32 (3.11 to 3.13).
    let table = words[3];
    let full = read_u64(table.wrapping_add(16));
    let mut n = 0usize;
    match full {
        Some(full) if full <= u32::MAX as u64 => {
            ev.table_full_len = full as u32;
            n = full as usize;
            if n > PY_CODE_TABLE {
                n = PY_CODE_TABLE;
                ev.flags |= py_code_flags::CUT;
            }
            let rc = unsafe {
                aya_ebpf::helpers::generated::bpf_probe_read_user(
                    ev.table.as_mut_ptr() as *mut c_void,
                    n as u32,
                    table.wrapping_add(32) as *const c_void,
                )
            };
            if rc != 0 {
                n = 0;
                ev.flags |= py_code_flags::TABLE_UNREADABLE;
            }
        }
        _ => {
            ev.table_full_len = 0;
            ev.flags |= py_code_flags::TABLE_UNREADABLE;
        }
    }
    ev.table_len = n as u32;
    let len = PY_CODE_HEADER + (n & (2 * PY_CODE_TABLE - 1)).min(PY_CODE_TABLE);
    let bytes = unsafe { core::slice::from_raw_parts(ev as *const PyCodeEvent as *const u8, len) };
    if EVENTS.output::<[u8]>(bytes, BPF_RB_NO_WAKEUP).is_err() {
        bump(counter::RINGBUF_FULL);
        return false;
    }
    let _ = PY_CODES_SENT.insert(key, &1, 0);
    true
}

/// Copies a compact `str`'s characters (at most `room` bytes) to `dst`: (bytes copied,
/// character width). Flags a string that cannot be read or was cut.
#[inline(always)]
fn read_name(p: &PyProcess, addr: u64, dst: *mut u8, room: usize, flags: &mut u16) -> (u16, u8) {
    // `PyASCIIObject.length` at 16 and `.state` at 32 (3.11 to 3.13).
    let (Some(len), Ok(state)) = (read_u64(addr.wrapping_add(16)), unsafe {
        bpf_probe_read_user(addr.wrapping_add(32) as *const u32)
    }) else {
        *flags |= py_code_flags::NAME_UNREADABLE;
        return (0, 0);
    };
    let kind = (state >> 2) & 7;
    let compact = (state >> 5) & 1 != 0;
    let ascii = (state >> 6) & 1 != 0;
    if !compact || !(kind == 1 || kind == 2 || kind == 4) || len > (1 << 16) {
        *flags |= py_code_flags::NAME_UNREADABLE;
        return (0, 0);
    }
    let data = addr.wrapping_add(if ascii {
        p.str_ascii_data
    } else {
        p.str_compact_data
    } as u64);
    let mut n = (len * kind as u64) as usize;
    if n > room {
        n = room;
        *flags |= py_code_flags::CUT;
    }
    let n = n & (PY_CODE_FILE * 2 - 1);
    let n = if n > room { room } else { n };
    let rc = unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            dst as *mut c_void,
            n as u32,
            data as *const c_void,
        )
    };
    if rc != 0 {
        *flags |= py_code_flags::NAME_UNREADABLE;
        return (0, 0);
    }
    (n as u16, kind as u8)
}
