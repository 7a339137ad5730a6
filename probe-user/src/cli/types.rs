//! The mode, the usage error, and the limits the value parsers check ([`Options`] itself is
//! declared with its options in `args.rs`). Nothing here parses.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

use super::Options;
use super::values::parse_watch;
use crate::settings::*;

/// Name used in messages, usage lines and `--version`.
pub const PROGRAM_NAME: &str = "memscope-bpf";
/// Default output directory, relative to the current directory.
pub const DEFAULT_OUTPUT_DIR: &str = "memscopeDumpResults";
/// Stack depth used by `--call-stack=c` / `python` without an explicit depth.
pub const DEFAULT_CALL_STACK_DEPTH: u32 = 50;
/// Largest accepted `--call-stack` depth.
pub const MAX_CALL_STACK_DEPTH: u32 = 1000;
/// Largest accepted OOM top-K.
pub const MAX_OOM_TOP_K: u32 = 1000;
/// At most this many `--steps` values (`SelectedStepList.stepIdList[5]`).
pub const MAX_STEPS: usize = 5;
/// Default BPF ring buffer size in MiB.
pub const DEFAULT_RING_BUFFER_MIB: u32 = 64;
/// Largest accepted BPF ring buffer size in MiB.
pub const MAX_RING_BUFFER_MIB: u32 = 1024;
/// Longest accepted path (and `--input-path` value), in bytes.
pub const MAX_PATH_LEN: usize = 4096;
/// Longest accepted output path component, in bytes.
pub const MAX_PATH_COMPONENT_LEN: usize = 255;
/// Most `/` characters allowed in the absolute output path.
pub const MAX_PATH_SLASHES: usize = 32;
/// Longest `--watch` start/end name in bytes (msMemScope stores them in 255-byte C buffers).
pub const MAX_WATCH_NAME_LEN: usize = 254;
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

impl Options {
    /// The parsed `--watch` value, if any.
    pub fn watch_config(&self) -> Option<WatchConfig> {
        self.watch.as_deref().and_then(|w| parse_watch(w).ok())
    }
}

/// A parse outcome that ends the program: usage errors (exit 2) or help/version text (exit 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CliError {
    pub message: String,
    pub exit_code: i32,
}

impl CliError {
    /// A usage error (exit code 2).
    pub fn usage(message: impl Into<String>) -> Self {
        CliError {
            message: message.into(),
            exit_code: EXIT_USAGE,
        }
    }

    /// Informational output (help/version) for stdout, exit code 0.
    pub fn info(message: impl Into<String>) -> Self {
        CliError {
            message: message.into(),
            exit_code: 0,
        }
    }

    /// True for `--help` / `--version` output (print on stdout, exit 0).
    pub fn is_info(&self) -> bool {
        self.exit_code == 0
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CliError {}
