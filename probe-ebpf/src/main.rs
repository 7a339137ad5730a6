//! memscope-bpf's BPF programs: small and generic on purpose. One module per concern, each
//! saying what it owns:
//!
//! * `calls`: `call_entry` / `call_return` (and `hal_return`, `call_return_site`) serve every
//!   probed function. The attach cookie is the probe id; `PROBE_SPECS[id]` says what to
//!   capture (`capture`: a string or struct argument, an out-pointer read at return). User
//!   space owns the table of which symbol gets which id. Finished calls without data go out
//!   in per-CPU batches (`batch`).
//! * `process` and `discovery`: four tracepoints keep the set of traced processes (`TRACED`)
//!   equal to the process tree being watched and tell user space about exec and opened
//!   files, so libraries loaded later get probes too.
//! * `stacks` and `python`: native and Python stack samples sent before a call; `sampling`:
//!   whether a call gets them (the node agent samples allocations by bytes).
//! * `maps` (what every concern shares) and `emit` (records to user space).
//!
//! Every module may use `maps` and `emit`; the program modules (`calls`, `process`,
//! `discovery`) use the helpers (`capture`, `batch`, `stacks`, which calls `python`), never
//! each other; `batch` reads the pending-call slot `calls` hands it.
//!
//! Every event is filtered on `TRACED` first, so other processes calling the same library pay
//! only the uprobe trap, a task-storage miss and one hash lookup. A thread that already has a
//! pending-call stack remembers that its process is traced until user space removes any
//! process from `TRACED` (`TRACED_GEN`), so traced HAL calls skip the lookup.
#![no_std]
#![no_main]
#![allow(internal_features)]
#![feature(core_intrinsics)]

mod batch;
mod calls;
mod capture;
mod discovery;
mod emit;
mod maps;
mod process;
mod python;
mod sampling;
mod stacks;

use aya_ebpf::{
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};

/// Benchmark floor: the same attach points with programs that do nothing, so `cargo xtask
/// bench` can separate the kernel's uprobe cost from ours.
#[uprobe]
pub fn noop_entry(_ctx: ProbeContext) -> u32 {
    0
}

#[uretprobe]
pub fn noop_return(_ctx: RetProbeContext) -> u32 {
    0
}

#[uprobe]
pub fn noop_return_site(_ctx: ProbeContext) -> u32 {
    0
}

/// For tests of how a refusal is reported (`MEMSCOPE_BPF_REFUSED_ENTRY`): every verifier
/// refuses it, as a kernel might refuse the real programs. It reads through the first argument,
/// a number to the verifier, not a pointer.
#[uprobe]
pub fn refused_entry(ctx: ProbeContext) -> u32 {
    let addr: u64 = ctx.arg(0).unwrap_or(0);
    unsafe { core::ptr::read_volatile(addr as *const u32) }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
