//! Every uprobe program a probe may get is loaded when the tracer starts, before any target
//! runs: a program the kernel's verifier refuses stops the tracer with the verifier's last
//! lines and a non-zero exit. Loaded at the first attach instead, a refusal was a warning at
//! each library, and the target ran to its end without a single probe, its exit status
//! looking like success (how kernels before 6.13 showed a verifier difference, session 15).

use anyhow::{Result, anyhow};
use aya::programs::{ProgramError, UProbe};

use super::{Bpf, NOOP_PROGRAMS, UprobePrograms, program};

/// Environment variable for tests of how a refusal is reported: the entry program becomes
/// `refused_entry`, which every verifier refuses.
pub const REFUSED_ENTRY_ENV: &str = "MEMSCOPE_BPF_REFUSED_ENTRY";

/// The entry program of [`REFUSED_ENTRY_ENV`].
pub(super) const REFUSED_ENTRY: &str = "refused_entry";

/// How many of the verifier's last lines an error shows (where it stopped, and why).
pub(crate) const VERIFIER_LINES: usize = 20;

/// `programs` with its entry replaced by [`REFUSED_ENTRY`] when [`REFUSED_ENTRY_ENV`] is set.
pub(super) fn with_test_refusal(programs: UprobePrograms) -> UprobePrograms {
    match std::env::var_os(REFUSED_ENTRY_ENV) {
        Some(_) => (REFUSED_ENTRY, programs.1, programs.2, programs.3),
        None => programs,
    }
}

impl Bpf {
    /// Loads every uprobe program the probes may get (those the multi-uprobe links already
    /// loaded are skipped): a refusal is an error naming the program, with the verifier's
    /// last lines.
    pub(super) fn load_uprobe_programs(&mut self) -> Result<()> {
        let mut names = names_of(self.uprobe_programs).to_vec();
        if self.noop_lib.is_some() {
            names.extend(names_of(NOOP_PROGRAMS));
        }
        // A name given twice is loaded by then: skipped with the loaded ones.
        for name in names {
            if self.multi.as_ref().is_some_and(|m| m.has(name)) {
                continue;
            }
            let up: &mut UProbe = program(&mut self.ebpf, name)?.try_into()?;
            if up.fd().is_ok() {
                continue;
            }
            up.load().map_err(|e| refusal(name, e))?;
        }
        Ok(())
    }
}

fn names_of(p: UprobePrograms) -> [&'static str; 4] {
    [p.0, p.1, p.2, p.3]
}

/// The error for program `name` the kernel would not load.
fn refusal(name: &str, e: ProgramError) -> anyhow::Error {
    match e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => anyhow!(
            "the kernel refused the uprobe program {name} ({io_error}): nothing could be \
             traced, so no target is run. Please report it with `uname -r` and these last \
             lines of the kernel's verifier:\n{}",
            last_lines(&verifier_log.to_string(), VERIFIER_LINES)
        ),
        other => anyhow!(other).context(format!("cannot load the uprobe program {name}")),
    }
}

/// The last `n` lines of `text`, NULs of an unfilled log buffer left out.
pub(crate) fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.trim_end_matches('\0').trim_end().lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::last_lines;

    #[test]
    fn last_lines_keeps_the_end_of_the_log() {
        assert_eq!(last_lines("a\nb\nc\nd\n\0\0\0", 2), "c\nd");
        assert_eq!(last_lines("only\n", 20), "only");
        assert_eq!(last_lines("", 20), "");
    }
}
