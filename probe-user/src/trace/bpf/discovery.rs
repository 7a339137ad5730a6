//! Where library discovery's programs go: at the return of `do_sys_openat2` (fexit), where
//! only opens pay for them, or on the `openat` system call's tracepoints, which put every task
//! of the machine on the system calls' slow path while attached, traced or not (`perf bench
//! syscall basic`: docs/benchmark-notes.md, session 16).

use anyhow::{Context, Result};
use aya::{Btf, Ebpf, programs::FExit};

use super::{attach_tracepoint, program};

/// Environment variable that keeps library discovery on the `openat` tracepoints where the
/// kernel has fexit programs too (tests of the older kernels' path).
pub const OPEN_TRACEPOINTS_ENV: &str = "MEMSCOPE_BPF_OPEN_TRACEPOINTS";

/// The kernel function every `open`, `openat` and `openat2` ends in.
const OPEN_FUNCTION: &str = "do_sys_openat2";

/// Attaches library discovery: `opened` at `do_sys_openat2`'s return where the kernel can
/// (BTF, fexit programs: x86-64 since 5.5, arm64 since 6.0), else `enter_openat` and
/// `exit_openat`. Says which.
pub(super) fn attach(ebpf: &mut Ebpf, kernel_btf: Option<&Btf>) -> Result<&'static str> {
    let why = match kernel_btf {
        _ if std::env::var_os(OPEN_TRACEPOINTS_ENV).is_some() => OPEN_TRACEPOINTS_ENV.to_string(),
        None => "no kernel BTF".to_string(),
        Some(btf) => match attach_fexit(ebpf, btf) {
            Ok(()) => return Ok("fexit on do_sys_openat2"),
            Err(e) => format!("{e:#}"),
        },
    };
    crate::log::debug(&format!(
        "library discovery on the openat tracepoints ({why})"
    ));
    attach_tracepoint(ebpf, "enter_openat", "syscalls", "sys_enter_openat")?;
    attach_tracepoint(ebpf, "exit_openat", "syscalls", "sys_exit_openat")?;
    Ok("openat tracepoints")
}

fn attach_fexit(ebpf: &mut Ebpf, btf: &Btf) -> Result<()> {
    let prog: &mut FExit = program(ebpf, "opened")?.try_into()?;
    prog.load(OPEN_FUNCTION, btf)
        .with_context(|| format!("loading opened for {OPEN_FUNCTION}"))?;
    prog.attach()
        .with_context(|| format!("attaching opened to {OPEN_FUNCTION}"))?;
    Ok(())
}
