//! The mode, the usage error, and the limits of the options only the command line has
//! (`Options` itself is declared with its options in `args.rs`). Nothing here parses.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

/// Name used in messages, usage lines and `--version`.
pub const PROGRAM_NAME: &str = "memscope-bpf";
pub const DEFAULT_RING_BUFFER_MIB: u32 = 64;
pub const MAX_RING_BUFFER_MIB: u32 = 1024;
/// Exit code for usage errors.
pub const EXIT_USAGE: i32 = 2;

/// What to do: run a program, attach to a process, or compare two dumps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Launch `program` with `args` (passed through byte for byte).
    Launch {
        program: OsString,
        args: Vec<OsString>,
    },
    /// Attach to a running process.
    Attach { pid: u32 },
    /// Compare two previously written dump files.
    Compare { inputs: [PathBuf; 2] },
    /// `analyze --input=DUMP`: run the leak analysis on a saved dump.
    Analyze { input: PathBuf },
    /// `report --input-path=RUN[,RUN2]`: draw a run (HTML, Perfetto, folded, speedscope).
    Report {
        request: crate::report::ReportRequest,
    },
    /// `agent`: serve the node's live memory state (Prometheus, pprof).
    Agent(crate::agent::options::AgentOptions),
}

/// A parse outcome that ends the program: usage errors (exit 2) or help/version text (exit 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CliError {
    pub message: String,
    pub exit_code: i32,
}

impl CliError {
    pub fn usage(message: impl Into<String>) -> Self {
        CliError {
            message: message.into(),
            exit_code: EXIT_USAGE,
        }
    }

    /// Help or version text for stdout, exit code 0.
    pub fn info(message: impl Into<String>) -> Self {
        CliError {
            message: message.into(),
            exit_code: 0,
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CliError {}
