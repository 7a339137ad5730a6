//! Layouts shared by the BPF programs (`probe-ebpf`) and the user-space tracer (`probe-user`).
//!
//! The BPF side is deliberately generic: one entry program and one return program serve every
//! probed function. What each probe captures is described by a [`ProbeSpec`] that user space
//! writes into the `PROBE_SPECS` array; the attach cookie of each uprobe is the probe id that
//! indexes it. Adding a probed function therefore never changes BPF code.
#![no_std]

pub mod sampling;

/// Bytes of user memory a single event can carry (a C string or a copied struct).
pub const DATA_LEN: usize = 256;
/// Number of function arguments captured at entry.
pub const MAX_ARGS: usize = 6;
/// Size of the `PROBE_SPECS` array; probe ids are `0..MAX_PROBES`.
pub const MAX_PROBES: u32 = 128;

/// The bits of an attach cookie that are the probe id. User space may use the bits above
/// (e.g. a function index when one probe id serves many functions of a library): the BPF
/// side masks the cookie wherever it needs the id and hands the upper bits (`cookie >> 16`,
/// truncated to 32 bits) to user space in [`RawEvent::cpu`] of the call's event (not yet in
/// packed batch records, whose descriptor keeps 8 bits of probe id).
pub const COOKIE_PROBE_MASK: u64 = 0xffff;
/// Shift that gives the part of the cookie above the probe id.
pub const COOKIE_HI_SHIFT: u32 = 16;

/// Kind of a [`RawEvent`].
pub mod kind {
    /// A probed function call (entry-only probes, or entry + return).
    pub const CALL: u16 = 1;
    /// A traced process created a new process (not a thread); `args[0]` = child pid.
    pub const FORK: u16 = 2;
    /// A traced process called execve; `data` = the new program's path.
    pub const EXEC: u16 = 3;
    /// The last thread of a traced process exited.
    pub const EXIT: u16 = 4;
    /// A traced process opened a file; `data` = the path as passed to openat, `args[0]` = dfd.
    pub const OPEN: u16 = 5;
    /// Part of an array walked by a `BATCH` probe: `args[0..2]` = the call's first two
    /// arguments, `args[2]` = element count of the whole batch, `args[3]` = index of the first
    /// element here, `args[4]` = elements here; `data` = the elements (`array2` ones at
    /// `array2_base`).
    pub const CHUNK: u16 = 6;
}

/// Finished calls without data, sent together by the CPU that traced them (the per-CPU call
/// batch of probe-ebpf, flushed when full and by user space, see `flush_calls`): a
/// [`BATCH_HEADER`]-byte header `{ kind: u16 = BATCH_KIND, _: u16, words: u32 }`, then
/// `words` u64 words of calls packed as [`packed`] describes.
pub const BATCH_KIND: u16 = 8;
pub const BATCH_HEADER: usize = 8;
/// Most words a batch holds: the batch record stays under 4 KiB.
pub const BATCH_WORDS: usize = 500;
/// Length of the batch's word array: room for a whole call past any index below 512, so
/// the BPF side can bound its stores with a mask.
pub const BATCH_ARRAY_WORDS: usize = 512 + packed::MAX_WORDS;

/// A call packed into a batch: only what user space needs of it, 32 to 96 bytes instead of a
/// 104-byte [`RawEvent`] header (the bytes a call costs to move through the ring buffer are
/// most of what batching it costs). Words, in order:
/// 1. `pid | tid << 32`;
/// 2. the descriptor: probe id, event flags, which arguments follow, which optional words
///    follow, and the return value when it fits in an `i32` (the bit layout below);
/// 3. the timestamp (`ts_ns`; also `ret_ts_ns` unless [`RET_TS`] is set);
/// 4. optional, in this order: `ret_ts_ns` ([`RET_TS`]), `deref` ([`DEREF`]), `ret`
///    ([`RET_WORD`]);
/// 5. the arguments whose bit is set in the [`ARGS_SHIFT`] mask, lowest index first.
pub mod packed {
    /// Words of the longest packed call: 3 fixed, 3 optional, 6 arguments.
    pub const MAX_WORDS: usize = 12;
    pub const PROBE_MASK: u64 = 0xff;
    pub const FLAGS_SHIFT: u32 = 8;
    pub const FLAGS_MASK: u64 = 0xff;
    /// Bits 16..22: the arguments present.
    pub const ARGS_SHIFT: u32 = 16;
    pub const ARGS_MASK: u64 = 0x3f;
    pub const RET_TS: u64 = 1 << 22;
    pub const DEREF: u64 = 1 << 23;
    /// The return value does not fit in an `i32` and has its own word.
    pub const RET_WORD: u64 = 1 << 24;
    /// Bits 32..64: the return value as an `i32`, when [`RET_WORD`] is clear.
    pub const RET_SHIFT: u32 = 32;

    /// The descriptor word (everything but the return value).
    #[inline(always)]
    pub const fn descriptor(probe: u32, flags: u16, args: u32) -> u64 {
        (probe as u64 & PROBE_MASK)
            | (flags as u64 & FLAGS_MASK) << FLAGS_SHIFT
            | (args as u64 & ARGS_MASK) << ARGS_SHIFT
    }
}

/// Registers, a frame-pointer walk and a copy of the user stack, emitted just before the
/// CALL or CHUNK events of the same call on the same thread (see [`StackEvent`]).
pub const STACK_KIND: u16 = 7;

/// Bytes of user stack copied from the stack pointer up (fewer near the top of the stack)
/// when nothing says how deep the stack is.
pub const STACK_COPY: usize = 8192;
/// The most a copy may hold: when the call's Python stack was walked too, the copy reaches
/// past the outermost interpreter loop on the C stack, however deep (real PyTorch puts the
/// loop 9.4 KiB above torch_npu's allocator), up to this.
pub const STACK_COPY_MAX: usize = 64 * 1024;
/// Bytes copied past that interpreter loop's frame: its callers down to the thread's start.
pub const STACK_COPY_TAIL: usize = 4096;
/// Return addresses the kernel's frame-pointer walk (`bpf_get_stack`) may record.
pub const FP_FRAMES: usize = 127;

/// `StackEvent::flags`: the stack copy was left out to save ring space (see
/// `counter::STACKS_SHED`); only the registers and the frame-pointer walk are there.
pub const STACK_COPY_SHED: u16 = 1 << 0;

/// A stack sample. Only the first `STACK_HEADER + stack_len` bytes are sent.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct StackEvent {
    pub kind: u16,
    pub flags: u16,
    /// Valid entries of `frames`.
    pub nframes: u16,
    pub _pad: u16,
    pub pid: u32,
    pub tid: u32,
    pub ts_ns: u64,
    /// Instruction pointer, stack pointer and frame pointer at the probe.
    pub ip: u64,
    pub sp: u64,
    pub fp: u64,
    /// The link register (x30) on aarch64, where a function's return address is until its
    /// prologue saves it; 0 on x86-64 (the return address is on the stack).
    pub lr: u64,
    /// Valid bytes of `stack` (a copy of user memory from `sp` on).
    pub stack_len: u32,
    pub _pad2: u32,
    pub frames: [u64; FP_FRAMES + 1],
    pub stack: [u8; STACK_COPY_MAX],
}

/// Size of a [`StackEvent`] without its stack copy.
pub const STACK_HEADER: usize = core::mem::size_of::<StackEvent>() - STACK_COPY_MAX;

/// A Python stack sample (`--call-stack=python`): the calling thread's CPython frame chain,
/// emitted just before the CALL or CHUNK events of the same call, like a [`StackEvent`]. User
/// space turns each frame's code object and instruction pointer into `file(line): function`.
pub const PYSTACK_KIND: u16 = 9;
/// Frames one Python sample holds (deeper stacks are cut and flagged [`py_flags::TRUNCATED`]).
pub const PY_MAX_FRAMES: usize = 128;
/// Bytes of an `_PyInterpreterFrame` read at once: every field the walk needs lies in them.
pub const PY_FRAME_READ: usize = 80;
/// Bytes of a `PyThreadState` read at once when a cached one is checked: `prev`, `next`,
/// `native_thread_id` and the frame pointer lie in them (3.11 to 3.13; user space refuses a
/// layout where they do not).
pub const PY_TSTATE_READ: usize = 192;
/// [`PyProcess`] offsets that a version does not have.
pub const PY_NO_OFFSET: u32 = u32::MAX;

/// Bits of [`PyStackEvent::flags`].
pub mod py_flags {
    /// No thread state of the process's interpreters belongs to this thread (a thread that
    /// never ran Python, or one created before the interpreter knew it).
    pub const NO_THREAD_STATE: u16 = 1 << 0;
    /// Reading the thread state or a frame failed: the frames before it are valid.
    pub const READ_FAULT: u16 = 1 << 1;
    /// More frames than [`super::PY_MAX_FRAMES`].
    pub const TRUNCATED: u16 = 1 << 2;
    /// A frame's `previous` pointed back into the chain (it changed while being read).
    pub const CHAIN_LOOP: u16 = 1 << 3;
}

/// One Python frame of a [`PyStackEvent`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyFrameRecord {
    /// The frame's code object (`f_code`, `f_executable` from 3.13 on).
    pub code: u64,
    /// The instruction being executed (`prev_instr`, `instr_ptr` from 3.13 on).
    pub instr: u64,
    /// Bits 0..8: the frame's `owner`; bit 8: `is_entry` (3.11: the first frame run by its
    /// `_PyEval_EvalFrameDefault` call); bit 9 ([`PY_FRAME_HAS_IDS`]): bits 32..64 hold
    /// [`py_code_ids`] of the code object as it was at the call.
    pub meta: u64,
}

/// [`PyFrameRecord::meta`]: the code object's identity was read (bits 32..64).
pub const PY_FRAME_HAS_IDS: u64 = 1 << 9;

/// A code object's identity (32 bits) from its `co_filename`, `co_name`, `co_qualname` and
/// `co_linetable` pointers: user space compares it with the code object it reads later, so
/// that one freed and replaced by another code object at the same address in between is never
/// shown under the other one's name or lines.
pub const fn py_code_ids(words: [u64; 4]) -> u64 {
    let x =
        words[0] ^ words[1].rotate_left(16) ^ words[2].rotate_left(32) ^ words[3].rotate_left(48);
    (x ^ (x >> 32)) & 0xffff_ffff
}

/// A Python stack sample; only the first `PY_STACK_HEADER + nframes * 24` bytes are sent.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PyStackEvent {
    pub kind: u16,
    pub flags: u16,
    pub nframes: u16,
    pub _pad: u16,
    pub pid: u32,
    pub tid: u32,
    /// The thread's `PyThreadState` (0 when none was found).
    pub tstate: u64,
    /// The call's `ts_ns` (as its call record has it): pairs the sample with its call.
    pub ts_ns: u64,
    /// Innermost first.
    pub frames: [PyFrameRecord; PY_MAX_FRAMES],
}

/// Size of a [`PyStackEvent`] without its frames.
pub const PY_STACK_HEADER: usize =
    core::mem::size_of::<PyStackEvent>() - PY_MAX_FRAMES * core::mem::size_of::<PyFrameRecord>();

/// Where a traced process's CPython keeps its threads and frames (`PY_PROCS`, by pid):
/// the address of `_PyRuntime` and the structure offsets of its version, written by user
/// space once it has found the interpreter in the process's mappings.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyProcess {
    pub runtime: u64,
    /// `_PyRuntimeState.interpreters.head`, which `.main` follows in 3.11 to 3.13 (`struct
    /// pyinterpreters { mutex; head; main; next_id; }`): BPF reads both at once, and several
    /// interpreters run when the two differ (`main`, the first made, is last in the list).
    pub interpreters_head: u32,
    /// `PyInterpreterState.next`, `.threads.head`.
    pub interp_next: u32,
    pub interp_threads_head: u32,
    /// `PyThreadState.prev`, `.next`, `.native_thread_id`.
    pub tstate_prev: u32,
    pub tstate_next: u32,
    pub tstate_native_thread_id: u32,
    /// `PyThreadState.cframe` (3.11, 3.12) or `.current_frame` (3.13+).
    pub tstate_frame: u32,
    /// `_PyCFrame.current_frame`; [`PY_NO_OFFSET`] when `tstate_frame` is the frame itself.
    pub cframe_current_frame: u32,
    /// `_PyInterpreterFrame` fields, all below `PY_FRAME_READ - 8`.
    pub frame_code: u32,
    pub frame_previous: u32,
    pub frame_instr: u32,
    pub frame_owner: u32,
    /// `is_entry` (3.11 only, else [`PY_NO_OFFSET`]).
    pub frame_is_entry: u32,
    /// `PyCodeObject.co_filename` when `co_name`, `co_qualname` and `co_linetable` follow it:
    /// BPF reads the four at each frame ([`py_code_ids`]); [`PY_NO_OFFSET`] for none.
    pub code_ids: u32,
    /// `PyCodeObject.co_firstlineno` (read with the names at first sight: [`PyCodeEvent`]).
    pub code_firstlineno: u32,
    /// Where a compact `str`'s characters start: `sizeof(PyASCIIObject)` for ASCII ones,
    /// `sizeof(PyCompactUnicodeObject)` for the others.
    pub str_ascii_data: u32,
    pub str_compact_data: u32,
    /// Changed by user space each time it (re)configures the process: BPF's record of the code
    /// objects it has sent is keyed by it, so a process seen anew (exec) gets them sent again.
    pub generation: u32,
    /// `_PyRuntimeState.gilstate.tstate_current` (3.11: the state of the thread holding the
    /// GIL, so a live one), read with `interpreters` in one copy: where it is a thread's
    /// remembered state, the check that the state is still listed is not needed.
    /// [`PY_NO_OFFSET`] where the version keeps it elsewhere (3.12+: thread-local).
    pub tstate_current: u32,
    /// Non-zero once the interpreter's `code_dealloc` is probed for this process
    /// (`py_code_gone`): BPF may then remember the identity of the code objects it sent until
    /// they are freed, instead of reading it at every frame.
    pub code_gone: u32,
}

/// The bytes of `_PyRuntime` from `interpreters.head` to `gilstate.tstate_current` (and its 8
/// bytes) that BPF copies must be fewer than this ([`PyProcess::tstate_current`]).
pub const PY_RUNTIME_READ: usize = 1024;

/// A code object at first sight (`--call-stack=python`): its names, first line and line table
/// as they are at the call, sent once per process and code object (address and identity)
/// before the first [`PyStackEvent`] that names it, so that user space never has to read a
/// code object that may be freed by then (module code when the script ends, `exec`'d code,
/// lambdas). Only the first `PY_CODE_HEADER + table_len` bytes are sent.
pub const PYCODE_KIND: u16 = 10;
/// Bytes of a code object's file name, name and qualified name a [`PyCodeEvent`] holds.
pub const PY_CODE_FILE: usize = 512;
pub const PY_CODE_NAME: usize = 256;
/// Bytes of a line table a [`PyCodeEvent`] holds (a longer one is cut and flagged).
pub const PY_CODE_TABLE: usize = 4096;

/// Bits of [`PyCodeEvent::flags`].
pub mod py_code_flags {
    /// A name was unreadable or not a compact string: the record cannot be used.
    pub const NAME_UNREADABLE: u16 = 1 << 0;
    /// The line table was unreadable.
    pub const TABLE_UNREADABLE: u16 = 1 << 1;
    /// A name or the line table was longer than its room: only its start is here.
    pub const CUT: u16 = 1 << 2;
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct PyCodeEvent {
    pub kind: u16,
    pub flags: u16,
    pub pid: u32,
    /// The code object's address and its [`py_code_ids`] (as in [`PyFrameRecord::meta`]).
    pub code: u64,
    pub ids: u64,
    pub firstlineno: i32,
    /// Valid bytes of `table`, and the line table's length in the process.
    pub table_len: u32,
    pub table_full_len: u32,
    /// Valid bytes of each name and its character width (1, 2 or 4 bytes; `str` kinds).
    pub file_len: u16,
    pub name_len: u16,
    pub qualname_len: u16,
    pub file_kind: u8,
    pub name_kind: u8,
    pub qualname_kind: u8,
    pub _pad: [u8; 11],
    pub file: [u8; PY_CODE_FILE],
    pub name: [u8; PY_CODE_NAME],
    pub qualname: [u8; PY_CODE_NAME],
    pub table: [u8; PY_CODE_TABLE],
}

/// Size of a [`PyCodeEvent`] without its line table.
pub const PY_CODE_HEADER: usize = core::mem::offset_of!(PyCodeEvent, table);

/// Chunks a `BATCH` probe emits at most per call (more elements are counted as dropped).
pub const MAX_CHUNKS: u32 = 4096;

/// Bits of [`RawEvent::flags`].
pub mod event_flags {
    /// `data` holds a string that did not fit and was cut.
    pub const DATA_TRUNCATED: u16 = 1 << 0;
    /// Reading user memory for `data` failed.
    pub const DATA_FAULT: u16 = 1 << 1;
    /// Reading the pointer named by `ProbeSpec::deref_arg` at return failed.
    pub const DEREF_FAULT: u16 = 1 << 2;
    /// The event carries a return value (`ret` is valid).
    pub const HAS_RET: u16 = 1 << 3;
    /// The BPF side stopped the process (SIGSTOP) so probes can be attached before it goes
    /// on: user space must send SIGCONT once it has handled the event.
    pub const STOPPED: u16 = 1 << 4;
}

/// FNV-1a over a path up to its NUL (at most [`DATA_LEN`] bytes): the key of `KNOWN_PATHS`.
/// The BPF side computes the same function over the string passed to openat.
pub fn path_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = FNV_OFFSET;
    let mut i = 0;
    while i < bytes.len() && i < DATA_LEN {
        let b = bytes[i];
        if b == 0 {
            break;
        }
        h = (h ^ b as u64).wrapping_mul(FNV_PRIME);
        i += 1;
    }
    h
}

/// FNV-1a over a file name up to and including its first `.so` (the whole name when it has
/// none): the key of `VENDOR_NAMES`, so `libascend_hal.so.1` is held as `libascend_hal.so` is.
/// The BPF side computes the same over the last component of the path passed to openat.
pub fn vendor_name_hash(name: &[u8]) -> u64 {
    let mut h: u64 = FNV_OFFSET;
    let mut i = 0;
    while i < name.len() && i < DATA_LEN {
        let b = name[i];
        if b == 0 {
            break;
        }
        h = (h ^ b as u64).wrapping_mul(FNV_PRIME);
        if i >= 2 && name[i - 2] == b'.' && name[i - 1] == b's' && b == b'o' {
            break;
        }
        i += 1;
    }
    h
}

/// The key of `CLEARED` (the agent's holds): an opened path's [`path_hash`] in one cgroup. The
/// same path may name another container's file, so a path cleared in one cgroup is held
/// again, once, in another (a second path or cgroup to a probed file gets no new probes).
pub fn hold_key(path_hash: u64, cgroup_id: u64) -> u64 {
    path_hash ^ cgroup_id.wrapping_mul(FNV_PRIME).rotate_left(29)
}

/// The key of `HOLDERS`, the registry of holds every tracer on the node shares: thread `tid`
/// stopped at an open by the tracer whose id (its `TRACER` map's id) is `tracer`.
pub fn holder_key(tid: u32, tracer: u32) -> u64 {
    ((tid as u64) << 32) | tracer as u64
}

/// The thread and tracer of a [`holder_key`].
pub fn holder_of(key: u64) -> (u32, u32) {
    ((key >> 32) as u32, key as u32)
}

pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
pub const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Linux SIGSTOP.
pub const SIGSTOP: u32 = 19;

/// Bits of [`ProbeSpec::flags`].
pub mod spec_flags {
    /// The probe has a uretprobe: entry stores the call, return emits it.
    pub const WANTS_RETURN: u32 = 1 << 0;
    /// Copy a NUL-terminated string from the address in `data_arg` at entry.
    pub const DATA_IS_STRING: u32 = 1 << 1;
    /// Copy `data_len` raw bytes from the address in `data_arg` at entry.
    pub const DATA_IS_BYTES: u32 = 1 << 2;
    /// At return, read the u64 that the pointer argument `deref_arg` points to (out-parameters).
    pub const DEREF_AT_RETURN: u32 = 1 << 3;
    /// After copying `data_len` bytes, follow the pointer stored at `data[indirect_off]` and
    /// append `indirect_len` bytes from there (a struct that points to a descriptor). Both
    /// `data_len` and `indirect_len` must be below `DATA_LEN / 2`.
    pub const INDIRECT: u32 = 1 << 4;
    /// The copied struct describes an array (`count_off`, `array_off`): emit it as CHUNK
    /// events instead of a CALL event (at return when `WANTS_RETURN`, else at entry).
    pub const BATCH: u32 = 1 << 5;
    /// Stop the process at entry (when `stop_on_discovery`): user space needs it intact, as
    /// at `exit()` where it snapshots the mappings its stacks are symbolized with.
    pub const STOP_AT_ENTRY: u32 = 1 << 6;
    /// With `INDIRECT`: the pointed-to data is a NUL-terminated string (a C++ `std::string`'s
    /// characters, say), read up to its NUL or `indirect_len` bytes, never past a fault.
    pub const INDIRECT_STR: u32 = 1 << 7;
    /// The function may be re-entered on one thread before it returns (an ATB graph runner
    /// executes its node runners): entries waiting for their return are told apart by the
    /// stack pointer, not only by thread and probe.
    pub const NESTED: u32 = 1 << 8;
    /// Calls without data: the call's one timestamp is taken at entry (`ret_ts_ns` repeats
    /// it). For calls whose effect user space dates at entry (a free: the block may be handed
    /// out again before the call returns). A clock read costs ~40 ns here; one is enough.
    pub const TIME_AT_ENTRY: u32 = 1 << 9;
    /// Calls without data: the one timestamp is taken at return (`ts_ns` repeats it), for
    /// calls dated at return (an allocation exists once it returned).
    pub const TIME_AT_RETURN: u32 = 1 << 10;
    /// Entry-only calls that user space needs only as markers (a task starting on a worker
    /// thread): no stack sample, C or Python.
    pub const NO_STACK: u32 = 1 << 11;
    /// Entry-only calls that need the caller's Python stack and never a C stack (a task
    /// enqueued from Python: its stack is carried to the thread that runs the task).
    pub const PYTHON_STACK_ONLY: u32 = 1 << 12;
    /// At return, read counters of the object in `deref_arg` through one pointer member
    /// `p = *(obj + member)`: `*(p + used)` into `deref`, and, when the cookie names them,
    /// `*(p + a) + *(p + b)` into `args[CHAIN_SUM_ARG]` (`u64::MAX` if unreadable), the
    /// offsets packed in the cookie's part above the probe id ([`read_chain`]; user space finds
    /// them in the library's code; 0: not found, nothing read). A MindSpore pool's own `used`
    /// and reserved bytes, read by the thread that just changed them.
    pub const READ_CHAIN: u32 = 1 << 13;
    /// With `DATA_IS_BYTES`, at entry: a call whose copied byte `data[skip_off]` is
    /// `skip_value` is dropped in BPF (no event, no stack), for a probed function that is also
    /// called for something no row needs (torch_npu's report of a BLOCK_FREE).
    pub const SKIP_BYTE: u32 = 1 << 14;
}

/// The argument slot a `READ_CHAIN` probe's second read (a sum of two counters) goes to: the
/// last, so such probes hook functions of fewer arguments.
pub const CHAIN_SUM_ARG: usize = MAX_ARGS - 1;

/// The offsets of a `READ_CHAIN` read, packed in the 32 cookie bits above the probe id:
/// the member (bits 18..32, bytes) and three counters behind it as 8-byte slots below 64
/// (`used` in bits 12..18, the summed pair in 6..12 and 0..6; the pair (0, 0): none).
pub mod read_chain {
    /// Packs the offsets; None when they do not fit (or the member is 0: the vtable).
    pub const fn pack(member: u64, used: u64, sum: Option<(u64, u64)>) -> Option<u32> {
        let (a, b) = match sum {
            Some(pair) => pair,
            None => (0, 0),
        };
        if member == 0 || member >= 1 << 14 || (a == b && sum.is_some()) {
            return None;
        }
        match (slot(used), slot(a), slot(b)) {
            (Some(used), Some(a), Some(b)) => {
                Some(((member << 18) | (used << 12) | (a << 6) | b) as u32)
            }
            _ => None,
        }
    }
    /// The 8-byte slot of a counter at `offset`, below 64.
    const fn slot(offset: u64) -> Option<u64> {
        if offset.is_multiple_of(8) && offset < 512 {
            Some(offset / 8)
        } else {
            None
        }
    }
    pub const fn member(hi: u32) -> u64 {
        (hi >> 18) as u64
    }
    pub const fn used(hi: u32) -> u64 {
        ((hi >> 12) & 63) as u64 * 8
    }
    /// The summed pair, None when not asked for.
    pub const fn sum(hi: u32) -> Option<(u64, u64)> {
        if hi & 0xfff == 0 {
            None
        } else {
            Some((((hi >> 6) & 63) as u64 * 8, (hi & 63) as u64 * 8))
        }
    }
}

/// What a probe captures, indexed by probe id (the attach cookie).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeSpec {
    pub flags: u32,
    /// Argument index holding the address of the string or struct to copy.
    pub data_arg: u32,
    /// Byte count for `DATA_IS_BYTES` (at most [`DATA_LEN`]).
    pub data_len: u32,
    /// Argument index of the out-pointer read at return.
    pub deref_arg: u32,
    pub indirect_off: u32,
    pub indirect_len: u32,
    /// Offsets in the copied struct of the element count (u64) and of the array pointer.
    pub count_off: u32,
    pub array_off: u32,
    pub elem_size: u32,
    /// Elements per CHUNK event (`per_chunk * elem_size` <= `array2_base`).
    pub per_chunk: u32,
    /// Optional parallel array (e.g. handles written by the callee): pointer offset in the
    /// struct (`NO_ARRAY2` for none), element size, and where its elements go in `data`.
    /// The BPF side bounds these with masks: `per_chunk * elem_size < DATA_LEN`,
    /// `array2_base` a multiple of `DATA_LEN / 4`, `per_chunk * elem2_size < DATA_LEN / 4`.
    pub array2_off: u32,
    pub elem2_size: u32,
    pub array2_base: u32,
    /// Bit i set: argument i is kept in a batched call (see [`packed`]); the others reach
    /// user space as 0. [`ALL_ARGS`] for probes that keep them all.
    pub kept_args: u32,
    /// `SKIP_BYTE`: the offset in the copied data of the byte that drops a call, and its value.
    pub skip_off: u32,
    pub skip_value: u32,
}

/// `ProbeSpec::kept_args` keeping every argument.
pub const ALL_ARGS: u32 = (1 << MAX_ARGS) - 1;

/// `ProbeSpec::array2_off` when there is no second array.
pub const NO_ARRAY2: u32 = u32::MAX;

/// One record in the `EVENTS` ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawEvent {
    pub kind: u16,
    pub flags: u16,
    /// Probe id for [`kind::CALL`].
    pub probe: u16,
    /// Valid bytes in `data`.
    pub data_len: u16,
    /// Thread-group id (the process id users see).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// For [`kind::CALL`] events sent as a whole event (not packed in a batch): the attach
    /// cookie's bits above the probe id (`cookie >> COOKIE_HI_SHIFT`, 0 for the tracer's own
    /// probes). Other events: the CPU (unused by user space).
    pub cpu: u32,
    /// CLOCK_MONOTONIC nanoseconds (bpf_ktime_get_ns) of the entry, or of the event.
    pub ts_ns: u64,
    /// CLOCK_MONOTONIC nanoseconds of the return, 0 for entry-only events.
    pub ret_ts_ns: u64,
    pub args: [u64; MAX_ARGS],
    pub ret: u64,
    /// The value read through `deref_arg` at return.
    pub deref: u64,
    pub data: [u8; DATA_LEN],
}

/// Bytes of a [`RawEvent`] before `data`: a record is sent as this header plus `data_len`
/// bytes of data.
pub const RAW_HEADER: usize = core::mem::size_of::<RawEvent>() - DATA_LEN;

impl RawEvent {
    pub const fn zeroed() -> Self {
        RawEvent {
            kind: 0,
            flags: 0,
            probe: 0,
            data_len: 0,
            pid: 0,
            tid: 0,
            cpu: 0,
            ts_ns: 0,
            ret_ts_ns: 0,
            args: [0; MAX_ARGS],
            ret: 0,
            deref: 0,
            data: [0; DATA_LEN],
        }
    }

    /// The valid part of `data`.
    pub fn data(&self) -> &[u8] {
        let n = (self.data_len as usize).min(DATA_LEN);
        &self.data[..n]
    }
}

/// Indexes of the per-CPU `COUNTERS` array.
pub mod counter {
    /// Events dropped because the ring buffer was full.
    pub const RINGBUF_FULL: u32 = 0;
    /// Calls whose entry could not be stored (pending map full, or more than 8 calls in
    /// flight on one thread): the return is lost.
    pub const PENDING_FULL: u32 = 1;
    /// Returns whose stored entry belongs to another process (a reused thread id).
    pub const ORPHAN_RETURN: u32 = 2;
    /// Processes that could not be added to the traced set (map full).
    pub const TRACED_FULL: u32 = 3;
    /// Batch elements beyond `MAX_CHUNKS` chunks, or whose memory could not be read.
    pub const BATCH_DROPPED: u32 = 4;
    /// Stack samples sent without their copy of the stack because the ring buffer was more
    /// than half full (`--call-stack=c` under load): the events stay, the stacks get shorter.
    pub const STACKS_SHED: u32 = 5;
    pub const COUNT: u32 = 6;
}

/// `TracepointOffsets::exit_group_dead` on kernels whose `sched_process_exit` has no
/// `group_dead` field (it came in 6.16; the arm64 VM runs 6.12): the process counts as gone
/// when its main thread exits.
pub const NO_GROUP_DEAD: u32 = u32::MAX;

/// Offsets into tracepoint records, read from tracefs `format` files by user space and
/// handed to the BPF programs as globals, so that a kernel that moves a field still works.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TracepointOffsets {
    pub newtask_pid: u32,
    pub newtask_clone_flags: u32,
    pub exec_filename_loc: u32,
    /// [`NO_GROUP_DEAD`] where `sched_process_exit` has no `group_dead` (before Linux 6.16).
    pub exit_group_dead: u32,
    pub openat_dfd: u32,
    pub openat_filename: u32,
    pub openat_ret: u32,
    /// `flags` of `sys_enter_openat`: an open for writing is never held (`hold_vendor_opens`).
    pub openat_flags: u32,
    /// 1: stop a traced process at exec and at the open of an unknown shared object until
    /// user space has attached (launch mode). 0: never signal the target (attach mode).
    pub stop_on_discovery: u32,
    /// 1 (the node agent): stop a process at the open of a shared object whose name is in
    /// `VENDOR_NAMES` and whose path is not yet `CLEARED` in its cgroup, recording it in
    /// `HOLDERS`, until user space has attached that file's probes.
    pub hold_vendor_opens: u32,
    /// Stack samples with every traced call (`--call-stack=c`): 0 none, 1 the kernel's
    /// frame-pointer walk only, 2 that plus a copy of the user stack for CFI unwinding (past
    /// the outermost interpreter loop under a Python call), 3 as 2 with an 8 KiB copy always
    /// (the design before, for the benchmark).
    pub capture_stacks: u32,
    /// Not 0: a Python stack sample with every traced call of a process in `PY_PROCS`
    /// (`--call-stack=python:N`), of at most this many frames (and `PY_MAX_FRAMES`).
    pub python_stacks: u32,
}

/// Linux `CLONE_THREAD`.
pub const CLONE_THREAD: u64 = 0x0001_0000;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain `repr(C)` structs of integers and byte arrays, every bit pattern valid.
    unsafe impl aya::Pod for super::RawEvent {}
    unsafe impl aya::Pod for super::ProbeSpec {}
    unsafe impl aya::Pod for super::TracepointOffsets {}
    unsafe impl aya::Pod for super::StackEvent {}
    unsafe impl aya::Pod for super::PyStackEvent {}
    unsafe impl aya::Pod for super::PyProcess {}
}

#[cfg(test)]
mod tests {
    use super::read_chain;

    #[test]
    fn read_chain_offsets_round_trip_or_are_refused() {
        // MindSpore 2.10's pool: used at *(pool+0xd8)+0, reserved at +0x18 and +0x10.
        let hi = read_chain::pack(0xd8, 0, Some((0x18, 0x10))).unwrap();
        assert_eq!(read_chain::member(hi), 0xd8);
        assert_eq!(read_chain::used(hi), 0);
        assert_eq!(read_chain::sum(hi), Some((0x18, 0x10)));
        let used_only = read_chain::pack(0xd8, 0x8, None).unwrap();
        assert_eq!(
            (read_chain::used(used_only), read_chain::sum(used_only)),
            (8, None)
        );
        // Not read on a guess: unaligned, too far, the vtable member, one counter twice.
        assert_eq!(read_chain::pack(0xd8, 4, None), None);
        assert_eq!(read_chain::pack(0xd8, 0, Some((0x10, 0x200))), None);
        assert_eq!(read_chain::pack(0, 0, None), None);
        assert_eq!(read_chain::pack(1 << 14, 0, None), None);
        assert_eq!(read_chain::pack(0xd8, 0, Some((0x10, 0x10))), None);
    }
}
