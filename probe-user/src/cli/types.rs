//! What the command line asks for, as the rest of the tree consumes it: [`Options`], the mode,
//! the event/level/device/analysis sets with their config.json bitfields, and the limits the
//! value parsers check. Nothing here parses.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

use super::values::parse_watch;

/// Name used in messages, usage lines and `--version`.
pub const PROGRAM_NAME: &str = "memscope-bpf";
/// Default output directory, relative to the current directory.
pub const DEFAULT_OUTPUT_DIR: &str = "memscopeDumpResults";
/// Stack depth used by `--call-stack=c` / `python` without an explicit depth.
pub const DEFAULT_CALL_STACK_DEPTH: u32 = 50;
/// Largest accepted `--call-stack` depth.
pub const MAX_CALL_STACK_DEPTH: u32 = 1000;
/// `oomTopK` when `--analysis=oom` gives no K (and the value written to config.json otherwise).
pub const DEFAULT_OOM_TOP_K: u32 = 10;
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
/// NPU slots addressable with `--device=npu:N` (N < 32).
pub const MAX_NPU_SLOTS: u32 = 32;
/// Device id msMemScope uses for "unknown device"; such events always pass the device filter.
pub const UNKNOWN_DEVICE_ID: u32 = 9999;
/// `watchConfig.outputId` when no outid is given.
pub const WATCH_NO_OUTPUT_ID: u32 = u32::MAX;
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

/// Event kinds (config.json bits: 0 alloc, 1 free, 2 launch, 3 access).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventSet {
    pub alloc: bool,
    pub free: bool,
    pub launch: bool,
    pub access: bool,
}

impl EventSet {
    /// No events.
    pub const NONE: EventSet = EventSet {
        alloc: false,
        free: false,
        launch: false,
        access: false,
    };
    /// msMemScope's default `--events`: alloc, free, launch.
    pub const CLI_DEFAULT: EventSet = EventSet {
        alloc: true,
        free: true,
        launch: true,
        access: false,
    };

    /// Bitfield as written to config.json (`eventType` / `dumpEventType`).
    pub fn bits(&self) -> u8 {
        u8::from(self.alloc)
            | (u8::from(self.free) << 1)
            | (u8::from(self.launch) << 2)
            | (u8::from(self.access) << 3)
    }

    /// Union of two sets.
    pub fn union(self, other: EventSet) -> EventSet {
        EventSet {
            alloc: self.alloc || other.alloc,
            free: self.free || other.free,
            launch: self.launch || other.launch,
            access: self.access || other.access,
        }
    }

    /// The event-to-event implied collection rules: alloc needs free, free needs alloc,
    /// access needs alloc and free.
    pub fn with_implied(self) -> EventSet {
        let mut e = self;
        if self.alloc || self.free || self.access {
            e.alloc = true;
            e.free = true;
        }
        e
    }
}

/// Trace levels (config.json `levelType`: bit0 op, bit1 kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Levels {
    pub op: bool,
    pub kernel: bool,
}

impl Default for Levels {
    /// Default level: op only.
    fn default() -> Self {
        Levels {
            op: true,
            kernel: false,
        }
    }
}

impl Levels {
    /// Bitfield as written to config.json.
    pub fn bits(&self) -> u8 {
        u8::from(self.op) | (u8::from(self.kernel) << 1)
    }
}

/// Which devices' events are kept (spec §2.5 `IsNeedSkip`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceFilter {
    /// `npu`: every NPU (overrides `npu_mask`).
    pub all_npu: bool,
    /// `npu:N` slots, bit N set.
    pub npu_mask: u32,
    /// `cpu`: host (CPU) memory events.
    pub cpu: bool,
}

impl Default for DeviceFilter {
    /// Default device filter: all NPUs, no CPU.
    fn default() -> Self {
        DeviceFilter {
            all_npu: true,
            npu_mask: 0,
            cpu: false,
        }
    }
}

impl DeviceFilter {
    /// Whether events of NPU `id` are kept. The unknown device id 9999 always passes.
    pub fn wants_npu(&self, id: u32) -> bool {
        self.all_npu
            || id == UNKNOWN_DEVICE_ID
            || (id < MAX_NPU_SLOTS && self.npu_mask & (1u32 << id) != 0)
    }

    /// Whether CPU (host) events are kept.
    pub fn wants_cpu(&self) -> bool {
        self.cpu
    }
}

/// Analyses (config.json `analysisType`: bit0 leaks, 1 decompose, 2 inefficient, 3 oom).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AnalysisSet {
    pub leaks: bool,
    pub decompose: bool,
    pub inefficient: bool,
    /// `Some(K)` when OOM analysis is on, K = number of top records (1..=1000).
    pub oom_top_k: Option<u32>,
}

impl AnalysisSet {
    /// msMemScope's default `--analysis`: leaks.
    pub const CLI_DEFAULT: AnalysisSet = AnalysisSet {
        leaks: true,
        decompose: false,
        inefficient: false,
        oom_top_k: None,
    };

    /// Bitfield as written to config.json.
    pub fn bits(&self) -> u8 {
        u8::from(self.leaks)
            | (u8::from(self.decompose) << 1)
            | (u8::from(self.inefficient) << 2)
            | (u8::from(self.oom_top_k.is_some()) << 3)
    }

    /// True when no analysis is selected.
    pub fn is_empty(&self) -> bool {
        self.bits() == 0
    }

    /// Events these analyses need collected (spec §4 "Implied collection").
    pub fn implied_events(&self) -> EventSet {
        let mut e = EventSet::NONE;
        if self.leaks || self.oom_top_k.is_some() {
            e.alloc = true;
            e.free = true;
        }
        if self.decompose {
            e.alloc = true;
            e.free = true;
            e.access = true;
        }
        if self.inefficient {
            e = EventSet {
                alloc: true,
                free: true,
                launch: true,
                access: true,
            };
        }
        e
    }
}

/// Call-stack capture; `None` disables that kind of stack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallStack {
    pub c_depth: Option<u32>,
    pub python_depth: Option<u32>,
    /// `mixed[:D]` (ours): both stacks, and in the C column each `_PyEval_EvalFrameDefault`
    /// frame is replaced by the Python frames it was running.
    pub mixed: bool,
}

/// `--collect-mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CollectMode {
    /// Trace from the start (default).
    #[default]
    Immediate,
    /// Wait for the program to start tracing itself.
    Deferred,
}

impl CollectMode {
    /// config.json value: the declaration order is msMemScope's numbering.
    pub fn config_value(self) -> u8 {
        self as u8
    }
}

/// `--format`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DataFormat {
    #[default]
    Csv,
    Db,
}

impl DataFormat {
    /// config.json value: the declaration order is msMemScope's numbering.
    pub fn config_value(self) -> u8 {
        self as u8
    }
}

/// `--log-level`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogLevel {
    Debug,
    #[default]
    Info,
    Warning,
    Error,
}

impl LogLevel {
    /// config.json value: the declaration order is msMemScope's numbering.
    pub fn config_value(self) -> u8 {
        self as u8
    }
}

/// Parsed `--watch=[start[:outid]],end[,full-content]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchConfig {
    /// Op/kernel name that starts watching; `None` for `,end`.
    pub start: Option<String>,
    /// Only this output tensor of the start op (requires a start).
    pub output_id: Option<u32>,
    /// Op/kernel name that ends watching.
    pub end: String,
    /// Dump full tensor contents instead of checksums.
    pub full_content: bool,
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
