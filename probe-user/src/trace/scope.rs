//! Which processes the probes fire in: the traced ones (the default), or every process mapping
//! a probed library (`MEMSCOPE_BPF_SCOPE=system`, what a fleet-wide agent needs).

/// Which processes a probe fires in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every process mapping the file, now or later (system-wide tracing).
    AllProcesses,
    /// One process (all its threads); others mapping the file never trap.
    Process(u32),
    /// Every process of the traced set, now and later: one set of links per process, made
    /// again for each process that joins (`Bpf::trace_process`, `Bpf::scope_process`) and
    /// dropped when it leaves (`Bpf::forget_process`). Untraced processes never trap.
    Traced,
}

/// Environment variable choosing where probes fire: `system` puts them in every process
/// mapping a probed library (the BPF side still filters on the traced set; what a fleet-wide
/// agent needs); unset or `traced`, only in the traced processes.
pub const SCOPE_ENV: &str = "MEMSCOPE_BPF_SCOPE";

/// The probe scope chosen by `MEMSCOPE_BPF_SCOPE` (default: the traced processes).
pub fn probe_scope() -> Scope {
    match std::env::var(SCOPE_ENV).as_deref() {
        Ok("system") => {
            crate::log::debug(&format!(
                "{SCOPE_ENV}=system: probes fire in every process mapping a probed library"
            ));
            Scope::AllProcesses
        }
        Ok("traced") | Err(_) => Scope::Traced,
        Ok(other) => {
            crate::log::warn(&format!(
                "{SCOPE_ENV}={other} is neither `system` nor `traced`; probing the traced processes only"
            ));
            Scope::Traced
        }
    }
}
