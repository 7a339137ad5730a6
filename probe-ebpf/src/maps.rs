//! The maps and settings every concern shares: the event ring (`EVENTS`), the traced set
//! (`TRACED`, `TRACED_GEN`), the probe table (`PROBE_SPECS`), the per-CPU scratch event,
//! the loss counters and the tracepoint offsets user space writes before load
//! (`TP_OFFSETS`), with the small accessors for them; and `TaskStorage`, the task-local map
//! type aya-ebpf lacks. Maps private to one concern live in its module.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid,
        generated::{bpf_get_current_task_btf, bpf_task_storage_get},
    },
    macros::map,
    maps::{Array, HashMap, PerCpuArray, RingBuf},
};
use probe_common::{MAX_PROBES, ProbeSpec, RawEvent, TracepointOffsets, counter};

/// Events to user space. User space may resize it before load (`--buffer-size`).
#[map]
pub(crate) static EVENTS: RingBuf = RingBuf::with_byte_size(16 << 20, 0);

/// tgid -> parent tgid (0 for a root given by user space). Only these processes are traced.
#[map]
pub(crate) static TRACED: HashMap<u32, u32> = HashMap::with_max_entries(32768, 0);

/// Bumped by user space whenever it removes a process from `TRACED`: a thread's pending stack
/// remembers the generation in which its process was found traced, which spares the hot path
/// the `TRACED` lookup until the next removal.
#[map]
pub(crate) static TRACED_GEN: Array<u32> = Array::with_max_entries(1, 0);

/// `BPF_MAP_TYPE_TASK_STORAGE` in the BTF map form (aya-ebpf 0.2.1 has no wrapper for it):
/// the kernel requires BTF for the key and value, `BPF_F_NO_PREALLOC` and `max_entries` 0.
#[repr(C)]
pub(crate) struct TaskStorage<T> {
    r#type: *const [i32; aya_ebpf::bindings::bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE as usize],
    key: *const i32,
    value: *const T,
    max_entries: *const [i32; 0],
    map_flags: *const [i32; aya_ebpf::bindings::BPF_F_NO_PREALLOC as usize],
}

// SAFETY: placeholder pointers patched by the loader, never dereferenced.
unsafe impl<T> Sync for TaskStorage<T> {}

impl<T> TaskStorage<T> {
    pub(crate) const fn new() -> Self {
        TaskStorage {
            r#type: core::ptr::null(),
            key: core::ptr::null(),
            value: core::ptr::null(),
            max_entries: core::ptr::null(),
            map_flags: core::ptr::null(),
        }
    }

    /// The current task's value, created zeroed when `create` and missing.
    #[inline(always)]
    pub(crate) fn current(&self, create: bool) -> Option<&mut T> {
        let flags = if create {
            aya_ebpf::bindings::BPF_LOCAL_STORAGE_GET_F_CREATE as u64
        } else {
            0
        };
        let p = unsafe {
            bpf_task_storage_get(
                self as *const Self as *mut c_void,
                bpf_get_current_task_btf(),
                core::ptr::null_mut(),
                flags,
            )
        } as *mut T;
        if p.is_null() {
            None
        } else {
            Some(unsafe { &mut *p })
        }
    }
}

#[map]
pub(crate) static PROBE_SPECS: Array<ProbeSpec> = Array::with_max_entries(MAX_PROBES, 0);

/// A RawEvent is too large for the 512-byte BPF stack; build it here (slot 0: the event,
/// slot 1: chunks of a batch).
#[map]
pub(crate) static SCRATCH: PerCpuArray<RawEvent> = PerCpuArray::with_max_entries(2, 0);

#[map]
pub(crate) static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Filled in by user space from the tracefs format files before load.
#[unsafe(no_mangle)]
static TP_OFFSETS: TracepointOffsets = TracepointOffsets {
    newtask_pid: 8,
    newtask_clone_flags: 32,
    exec_filename_loc: 8,
    exit_group_dead: 32,
    openat_dfd: 16,
    openat_filename: 24,
    openat_ret: 16,
    openat_flags: 32,
    stop_on_discovery: 0,
    hold_vendor_opens: 0,
    capture_stacks: 0,
    python_stacks: 0,
};

#[inline(always)]
pub(crate) fn offsets() -> TracepointOffsets {
    // Volatile so the compiler does not fold the defaults in: user space rewrites them.
    unsafe { core::ptr::read_volatile(&TP_OFFSETS) }
}

#[inline(always)]
pub(crate) fn bump(index: u32) {
    if let Some(c) = COUNTERS.get_ptr_mut(index) {
        unsafe { *c += 1 };
    }
}

#[inline(always)]
pub(crate) fn current_ids() -> (u32, u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    ((pid_tgid >> 32) as u32, pid_tgid as u32)
}

#[inline(always)]
pub(crate) fn is_traced(tgid: u32) -> bool {
    unsafe { TRACED.get(&tgid).is_some() }
}
