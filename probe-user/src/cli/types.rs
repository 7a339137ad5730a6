//! What the command line asks for, as the rest of the tree consumes it: [`Options`], the mode,
//! the event/level/device/analysis sets with their config.json bitfields, and the limits the
//! value parsers check. Nothing here parses.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

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
/// Largest accepted `--compare` input file (8 GiB).
pub const MAX_COMPARE_INPUT_BYTES: u64 = 8 << 30;
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
}

/// Everything the command line asked for, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    pub mode: Mode,
    /// Absolute output directory ("." and ".." resolved lexically; need not exist yet).
    pub output_dir: PathBuf,
    /// Events to collect: `dump_events` plus the implied rules from events and analyses.
    pub events: EventSet,
    /// Events the user asked to write (`--events` as given).
    pub dump_events: EventSet,
    pub levels: Levels,
    pub devices: DeviceFilter,
    pub analysis: AnalysisSet,
    /// `--steps`: only events inside these mstx steps are kept (empty = all).
    pub steps: Vec<u32>,
    pub call_stack: CallStack,
    pub collect_mode: CollectMode,
    pub format: DataFormat,
    /// The validated `--watch` value as given; see [`Options::watch_config`].
    pub watch: Option<String>,
    pub log_level: LogLevel,
    /// `--lib` paths, canonicalized, each an existing readable regular file.
    pub libs: Vec<PathBuf>,
    /// BPF ring buffer size in MiB (power of two, 1..=1024).
    pub ring_buffer_mib: u32,
    /// `--as-root`: under sudo, launch the program as root instead of the invoking user.
    pub as_root: bool,
    /// `--max-file-mib`: rotate CSV dumps past this size.
    pub max_file_mib: Option<u32>,
    /// `--max-files`: keep at most this many dump files per device when rotating.
    pub max_files: Option<u32>,
    /// Deprecation notices and other warnings for the caller to print on stderr.
    pub warnings: Vec<String>,
    /// `analyze --by-site/--by-stack/--at/--timeline`.
    pub sites: crate::report::SitesRequest,
    /// `--report[=FILE]`: write the HTML report at the end of the run (`Some(None)`: in the
    /// traced process's directory).
    pub report_at_end: Option<Option<PathBuf>>,
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
