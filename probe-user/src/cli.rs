//! Command-line parsing and validation for `memscope-bpf`.
//!
//! The option set, defaults, validation rules and deprecated aliases follow msMemScope's
//! `msmemscope` client (see the spec, section 4), with one deliberate deviation: everything from
//! the first non-option argument on belongs to the traced program. msMemScope used GNU getopt
//! permutation and so also consumed options written after the program name; we never do.
//!
//! The parser is hand written (no clap) so that it can keep msMemScope's exact semantics:
//! `--opt=value` and `--opt value`, `-ovalue` and `-o value`, deprecated aliases with warnings,
//! list values split on `,` and the full-width comma `，`, and program arguments passed through
//! untouched even when they are not UTF-8.
//!
//! `--help` and `--version` come back as `Err(CliError { exit_code: 0, .. })` so that the caller
//! prints the message on stdout and exits 0; every usage error has `exit_code` 2.

// The public API is wider than what any one caller uses (bitfield helpers, constants, ...).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

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

// ---------------------------------------------------------------------------------------------
// Public types
// ---------------------------------------------------------------------------------------------

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

    /// True when no event kind is selected.
    pub fn is_empty(&self) -> bool {
        self.bits() == 0
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CollectMode {
    /// Trace from the start (default).
    #[default]
    Immediate,
    /// Wait for the program to start tracing itself.
    Deferred,
}

impl CollectMode {
    /// config.json `collectMode` value.
    pub fn config_value(self) -> u8 {
        match self {
            CollectMode::Immediate => 0,
            CollectMode::Deferred => 1,
        }
    }
}

/// `--format`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DataFormat {
    #[default]
    Csv,
    Db,
}

impl DataFormat {
    /// config.json `dataFormat` value.
    pub fn config_value(self) -> u8 {
        match self {
            DataFormat::Csv => 0,
            DataFormat::Db => 1,
        }
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
    /// config.json `logLevel` value.
    pub fn config_value(self) -> u8 {
        match self {
            LogLevel::Debug => 0,
            LogLevel::Info => 1,
            LogLevel::Warning => 2,
            LogLevel::Error => 3,
        }
    }

    /// Lower-case name as accepted by `--log-level`.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warning => "warning",
            LogLevel::Error => "error",
        }
    }
}

/// Parsed `--watch=[start[:outid]],end[,full-content]`.
#[derive(Clone, Debug, PartialEq, Eq)]
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

// ---------------------------------------------------------------------------------------------
// Help and version
// ---------------------------------------------------------------------------------------------

/// `memscope-bpf <version>`.
pub fn version_text() -> String {
    format!("{PROGRAM_NAME} {}", env!("CARGO_PKG_VERSION"))
}

/// The `--help` text.
pub fn help_text() -> String {
    format!(
        "\
{PROGRAM_NAME} {version} - trace the NPU memory of an unmodified process with eBPF uprobes,
writing msMemScope-compatible results (memscope_dump_<ts>.csv/.db, config.json, analyses).

USAGE:
    {PROGRAM_NAME} [OPTIONS] -- <PROGRAM> [ARGS...]     launch PROGRAM and trace it
    {PROGRAM_NAME} [OPTIONS] <PROGRAM> [ARGS...]        same, msMemScope style
    {PROGRAM_NAME} --pid <PID> [OPTIONS]                attach to a running process
    {PROGRAM_NAME} --compare --input-path <A>,<B>       compare two dump files
    {PROGRAM_NAME} analyze --input-path <DUMP> [-o DIR] leak analysis of a saved dump
    {PROGRAM_NAME} report --input-path <RUN> [-o FILE]  HTML report (and Perfetto trace) of a run
    {PROGRAM_NAME} agent [OPTIONS]                      node agent for Prometheus and pprof
                                                       ('{PROGRAM_NAME} agent --help')

    Everything from the first argument that is not an option belongs to PROGRAM:
    `{PROGRAM_NAME} --level=op bash run.sh --level=kernel` passes --level=kernel to run.sh.
    (Unlike msMemScope, options written after the program name are never consumed.)
    Tracing needs root, or CAP_BPF + CAP_PERFMON. Press Ctrl-C to detach: everything
    collected so far is written out. List values are comma separated (',' or '，').

TARGET SELECTION:
        --pid <PID>                 Attach to the running process PID instead of launching one
        --compare                   Compare two dump files instead of tracing (needs --input-path)
    -i, --input-path <A>,<B>        The two dump files to compare (regular files, not symlinks,
                                    at most 8 GiB each) [alias: --input, deprecated]
                                    Dumps are CSV or db files, ours or msMemScope's
        --lib <PATH>                Library to attach the uprobes to, e.g. the driver's
                                    libascend_hal.so (repeatable)
        --max-file-mib <MIB>        Rotate dumps: start a new CSV file once one passes MIB MiB
                                    (1..=1048576), each a complete dump with its header
                                    [default: one file per device, no limit]
        --max-files <N>             With --max-file-mib: keep at most N dump files per device
                                    (1..=10000), deleting the oldest [default: keep all]
        --as-root                   Under sudo, run the program as root; without it the program
                                    runs as the user who ran sudo (SUDO_UID, SUDO_GID and that
                                    user's groups) and the results belong to that user

WHAT TO COLLECT:
        --events <LIST>             alloc | free | launch | access | none
                                    [default: alloc,free,launch]; alloc and free are always
                                    collected together, access implies both ('traceback' is
                                    accepted for compatibility and ignored)
        --level <LIST>              op | kernel [default: op] (deprecated: 0 = op, 1 = kernel)
        --device <LIST>             npu | npu:N (N < 32) | cpu [default: npu, i.e. every NPU]
        --steps <LIST>              Keep only events inside these mstx steps (integers >= 1,
                                    at most 5); turns leak analysis off
        --call-stack <LIST>         c[:DEPTH] | python[:DEPTH], DEPTH 0..=1000 [default depth: 50];
                                    an empty value disables stacks [default: no stacks];
                                    python: CPython 3.11-3.13 frames read from outside the
                                    process (Call Stack(Python) column); mixed: c and python,
                                    with the Python frames in the C column in place of the
                                    interpreter loop (_PyEval_EvalFrameDefault) running them
        --collect-mode <MODE>       immediate | deferred [default: immediate]
        --watch <SPEC>              [START[:OUTID]],END[,full-content]: watch the outputs of
                                    op START until op END (the comma before END is required)
        --ring-buffer-mib <N>       BPF ring buffer size, a power of two 1..=1024 [default: 64]

ANALYSIS:
        --analysis <LIST>           leaks | decompose | inefficient | oom[:K] | none
                                    [default: leaks]; K is 1..=1000 [default: 10]. Analyses add
                                    the events they need to the collection without writing them
                                    leaks: blocks never freed, per process and per mstx step
                                    decompose: bytes per owner (CANN@module, PTA, ATB, ... plus
                                      labels a program sends as memscope-label-push/pop marks;
                                      python/memscope_labels.py does it from Python)
                                    inefficient: early_allocation, late_deallocation and
                                      temporary_idleness of PTA and ATB pool blocks
                                    oom: on an out-of-memory failure, the K newest and K largest
                                      live blocks with their stacks

OUTPUT:
    -o, --output-path <DIR>         Output directory [default: ./memscopeDumpResults]
                                    [alias: --output, deprecated]
        --format <FORMAT>           csv | db [default: csv] [alias: --data-format, deprecated]
        --report[=FILE]             At the end, also write the HTML report of the run
                                    [default FILE: report.html in the process's directory]

ANALYZE (first argument 'analyze'; a program named analyze runs with '-- analyze'):
    -i, --input-path <DUMP>         The dump to analyze (a regular file, not a symlink, at most
                                    8 GiB): HAL blocks never freed are reported as leaks
                                    (summary on stderr, leaks_<ts>.csv under --output-path),
                                    and the dump is replayed through decompose, inefficient
                                    and the OOM rows it holds.
        --by-site                   Also print live bytes per allocation site (file:line of
                                    the innermost frame outside vendor and framework code),
                                    largest first; needs a dump traced with --call-stack=c
        --by-stack                  Same, per whole call stack
        --at <WHEN>                 exit | peak | SECONDS after the dump's first event
                                    [default: exit]: when --by-site/--by-stack look
        --timeline[=MS]             Write memscope_timeline_<MS>ms.csv under -o: the local
                                    maximum per device in each MS-ms interval [default: 100]
                                    and the site holding the most then
                                    Only these, -i, -o, --log-level, -v and -q apply

REPORT (first argument 'report'):
    -i, --input-path <RUN>[,<RUN2>] A run: an --output-path directory, a process directory or
                                    one dump (ours or msMemScope's, CSV or db); with RUN2, the
                                    report also compares the two runs (RUN is the base)
    -o, --output-path <FILE>        The HTML file [default: ./memscope_report.html]; other
                                    formats are written beside it, named after it
        --format <LIST>             html | perfetto | folded | speedscope [default: html]
                                    perfetto: <stem>.perfetto.json (ui.perfetto.dev,
                                      chrome://tracing); folded: <stem>.exit.folded and
                                      <stem>.peak.folded (flamegraph.pl); speedscope:
                                      <stem>.speedscope.json, live bytes at the end and peak
        --perfetto                  Same as adding perfetto to --format

MISC:
        --log-level <LEVEL>         debug | info | warning | error [default: info]
    -v, --verbose, --debug          Same as --log-level=debug
    -q, --quiet                     Same as --log-level=error (an explicit --log-level wins)
    -h, --help                      Print this help and exit
    -V, --version                   Print the version and exit

EXAMPLES:
    # Trace a training script with the defaults (results in ./memscopeDumpResults)
    sudo {PROGRAM_NAME} -- python train.py

    # msMemScope-style invocation with another output directory
    sudo {PROGRAM_NAME} --output=./out bash run.sh

    # Attach to a running process; Ctrl-C detaches and writes the results
    sudo {PROGRAM_NAME} --pid 1234

    # Point at the driver library explicitly
    sudo {PROGRAM_NAME} --lib /usr/local/Ascend/driver/lib64/driver/libascend_hal.so \\
        -- python train.py

    # Kernel-level tracing with C and Python stacks
    sudo {PROGRAM_NAME} --level=op,kernel --call-stack=c:20,python:10 -- python train.py

    # Operators, kernels (ATen and ATB), tensor accesses and the memory breakdown
    sudo {PROGRAM_NAME} --level=op,kernel --events=alloc,free,launch,access \\
        --analysis=leaks,decompose,inefficient -- python train.py

    # Compare two runs
    {PROGRAM_NAME} --compare --input-path=base/memscope_dump_1.csv,new/memscope_dump_2.csv

    # Leak analysis of a saved dump (ours or msMemScope's, CSV or db)
    {PROGRAM_NAME} analyze --input=results/device_0/dump/memscope_dump_1.db -o ./analysis

    # Where the memory was at the peak, by source line, and the 100 ms maxima
    {PROGRAM_NAME} analyze -i memscope_dump_1.csv --by-site --at=peak --timeline

    # The report of a run, and a Perfetto trace beside it
    {PROGRAM_NAME} report -i ./memscopeDumpResults -o run.html --perfetto
",
        version = env!("CARGO_PKG_VERSION"),
    )
}

fn no_target_error() -> CliError {
    CliError::usage(format!(
        "nothing to trace: give a program to launch, --pid PID or --compare \
         (see '{PROGRAM_NAME} --help')"
    ))
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Render a user value for a message: control characters escaped.
fn shown(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

fn shown_os(s: &OsStr) -> String {
    shown(&s.to_string_lossy())
}

fn invalid(opt: &str, value: &str, what: &str) -> CliError {
    CliError::usage(format!("invalid {opt} value '{}': {what}", shown(value)))
}

/// Split a list value on ASCII ',' and full-width '，' (U+FF0C), skipping empty tokens.
pub fn split_list(value: &str) -> Vec<&str> {
    value
        .split([',', '\u{ff0c}'])
        .filter(|t| !t.is_empty())
        .collect()
}

/// Byte-level variant of [`split_list`] for values that may not be UTF-8. The full-width comma
/// is matched as its whole UTF-8 sequence, so it never splits another character.
fn split_list_os(value: &OsStr) -> Vec<&OsStr> {
    const FW: &[u8] = "\u{ff0c}".as_bytes();
    let b = value.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < b.len() {
        let sep = if b[i] == b',' {
            1
        } else if b[i..].starts_with(FW) {
            FW.len()
        } else {
            0
        };
        if sep > 0 {
            if i > start {
                out.push(OsStr::from_bytes(&b[start..i]));
            }
            i += sep;
            start = i;
        } else {
            i += 1;
        }
    }
    if b.len() > start {
        out.push(OsStr::from_bytes(&b[start..]));
    }
    out
}

/// Parse a plain decimal number: digits only, no sign, no leading zero (unless `allow_zero` and
/// the value is exactly "0"), fits u32.
fn parse_decimal(s: &str, allow_zero: bool) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if s.starts_with('0') {
        return if allow_zero && s == "0" {
            Some(0)
        } else {
            None
        };
    }
    s.parse().ok()
}

/// `stoul(s, nullptr, 0)`-style number: `0x` hex, leading-0 octal or decimal; whole string.
fn parse_c_number(s: &str) -> Option<u32> {
    let (digits, radix) = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        (h, 16)
    } else if s.len() > 1 && s.starts_with('0') {
        (&s[1..], 8)
    } else {
        (s, 10)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u32::from_str_radix(digits, radix).ok()
}

fn is_readable(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    unsafe { libc::access(c.as_ptr(), libc::R_OK) == 0 }
}

/// Make `path` absolute against `cwd`, resolving "." and ".." lexically.
pub fn lexical_absolute(path: &Path, cwd: &Path) -> PathBuf {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd.join(path)
    };
    let mut out = PathBuf::from("/");
    for comp in joined.components() {
        match comp {
            Component::Prefix(_) | Component::RootDir | Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(s) => out.push(s),
        }
    }
    out
}

fn current_dir() -> Result<PathBuf, CliError> {
    std::env::current_dir()
        .map_err(|e| CliError::usage(format!("cannot determine the current directory: {e}")))
}

fn output_char_allowed(c: char) -> bool {
    matches!(c, '.' | '/' | '_' | '-' | '~')
        || c.is_ascii_alphanumeric()
        || c.is_ascii_whitespace()
        || ('\u{4e00}'..='\u{9fa5}').contains(&c)
}

/// Check an absolute output directory against msMemScope's output path rules.
/// Returns the reason on failure.
fn check_output_dir(abs: &Path) -> Result<(), String> {
    let Some(s) = abs.to_str() else {
        return Err(format!(
            "the absolute path '{}' is not valid UTF-8",
            shown_os(abs.as_os_str())
        ));
    };
    if let Some(c) = s.chars().find(|&c| !output_char_allowed(c)) {
        return Err(format!(
            "the absolute path '{}' contains '{}'; allowed are letters, digits, \
             '.', '/', '_', '-', '~', whitespace and CJK characters U+4E00..U+9FA5",
            shown(s),
            shown(&c.to_string())
        ));
    }
    if s.len() > MAX_PATH_LEN {
        return Err(format!(
            "the absolute path is {} bytes long, more than {MAX_PATH_LEN}",
            s.len()
        ));
    }
    if let Some(comp) = s.split('/').find(|c| c.len() > MAX_PATH_COMPONENT_LEN) {
        return Err(format!(
            "the path component '{}...' is longer than {MAX_PATH_COMPONENT_LEN} bytes",
            shown(&comp.chars().take(32).collect::<String>())
        ));
    }
    let slashes = s.bytes().filter(|&b| b == b'/').count();
    if slashes > MAX_PATH_SLASHES {
        return Err(format!(
            "the absolute path '{}' has {slashes} '/' separators, more than {MAX_PATH_SLASHES}",
            shown(s)
        ));
    }
    match std::fs::metadata(abs) {
        Ok(md) if !md.is_dir() => Err(format!("'{}' exists and is not a directory", shown(s))),
        Ok(_) if !is_readable(abs) => Err(format!("'{}' exists but is not readable", shown(s))),
        _ => Ok(()),
    }
}

fn resolve_output(opt: &str, raw: &OsStr) -> Result<PathBuf, CliError> {
    let Some(value) = raw.to_str() else {
        return Err(CliError::usage(format!(
            "invalid {opt} value '{}': invalid output path, it is not valid UTF-8",
            shown_os(raw)
        )));
    };
    if value.trim().is_empty() {
        return Err(invalid(
            opt,
            value,
            "the output path must not be empty (default: ./memscopeDumpResults)",
        ));
    }
    if value.len() > MAX_PATH_LEN {
        return Err(CliError::usage(format!(
            "invalid {opt} value: invalid output path, it is {} bytes long, more than {MAX_PATH_LEN}",
            value.len()
        )));
    }
    if let Some(c) = value
        .chars()
        .next()
        .filter(|c| matches!(c, '=' | '+' | '-' | '@'))
    {
        return Err(invalid(
            opt,
            value,
            &format!(
                "invalid output path, it must not start with '{c}' (nor with '=', '+', '-' or '@')"
            ),
        ));
    }
    let abs = lexical_absolute(Path::new(value), &current_dir()?);
    check_output_dir(&abs)
        .map_err(|why| invalid(opt, value, &format!("invalid output path: {why}")))?;
    Ok(abs)
}

fn default_output_dir() -> Result<PathBuf, CliError> {
    let abs = current_dir()?.join(DEFAULT_OUTPUT_DIR);
    check_output_dir(&abs).map_err(|why| {
        CliError::usage(format!(
            "invalid output path: the default output directory is unusable: {why}; \
             choose another with -o/--output-path"
        ))
    })?;
    Ok(abs)
}

/// Parse and validate a `--watch` value.
pub fn parse_watch(value: &str) -> Result<WatchConfig, CliError> {
    const EXPECTED: &str = "invalid watch config, expected [START[:OUTID]],END[,full-content] \
                            (the comma before END is required; OUTID needs a START)";
    let bad = |why: &str| invalid("--watch", value, &format!("{why}; {EXPECTED}"));
    let Some((start_part, rest)) = value.split_once(',') else {
        return Err(bad("missing ','"));
    };
    let (end, tail) = match rest.split_once(',') {
        Some((e, t)) => (e, Some(t)),
        None => (rest, None),
    };
    if end.is_empty() {
        return Err(bad("END is empty"));
    }
    let full_content = match tail {
        None => false,
        Some("full-content") => true,
        Some(t) => return Err(bad(&format!("unexpected '{}' after END", shown(t)))),
    };
    let (start, output_id) = match start_part.split_once(':') {
        Some((s, id)) => {
            if s.is_empty() {
                return Err(bad("an OUTID needs a START name"));
            }
            let Some(id) = parse_decimal(id, true) else {
                return Err(bad(&format!(
                    "OUTID '{}' is not an unsigned 32-bit integer without leading zeros",
                    shown(id)
                )));
            };
            (Some(s), Some(id))
        }
        None if start_part.is_empty() => (None, None),
        None => (Some(start_part), None),
    };
    for name in start.iter().chain(std::iter::once(&end)) {
        if name.len() > MAX_WATCH_NAME_LEN {
            return Err(bad(&format!(
                "the name '{}...' is longer than {MAX_WATCH_NAME_LEN} bytes",
                shown(&name.chars().take(32).collect::<String>())
            )));
        }
    }
    Ok(WatchConfig {
        start: start.map(str::to_owned),
        output_id,
        end: end.to_owned(),
        full_content,
    })
}

// ---------------------------------------------------------------------------------------------
// Option table
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Opt {
    Help,
    Version,
    Verbose,
    Quiet,
    Pid,
    Compare,
    Input,
    Output,
    Events,
    Level,
    Steps,
    CallStack,
    CollectMode,
    Device,
    Analysis,
    Format,
    Watch,
    LogLevel,
    Lib,
    RingBuffer,
    BySite,
    ByStack,
    At,
    Timeline,
    Report,
    Perfetto,
    AsRoot,
    MaxFileMib,
    MaxFiles,
}

impl Opt {
    fn takes_value(self) -> bool {
        !matches!(
            self,
            Opt::Help
                | Opt::Version
                | Opt::Verbose
                | Opt::Quiet
                | Opt::Compare
                | Opt::BySite
                | Opt::ByStack
                | Opt::Timeline
                | Opt::Report
                | Opt::Perfetto
                | Opt::AsRoot
        )
    }

    /// Takes a value only when written `--opt=VALUE`.
    fn optional_value(self) -> bool {
        matches!(self, Opt::Timeline | Opt::Report)
    }
}

/// Long option lookup: the option and, for deprecated aliases, the replacement name.
fn lookup_long(name: &str) -> Option<(Opt, Option<&'static str>)> {
    let opt = match name {
        "help" => Opt::Help,
        "version" => Opt::Version,
        "verbose" | "debug" => Opt::Verbose,
        "quiet" => Opt::Quiet,
        "pid" => Opt::Pid,
        "compare" => Opt::Compare,
        "input-path" => Opt::Input,
        "input" => return Some((Opt::Input, Some("--input-path"))),
        "output-path" => Opt::Output,
        "output" => return Some((Opt::Output, Some("--output-path"))),
        "events" => Opt::Events,
        "level" => Opt::Level,
        "steps" => Opt::Steps,
        "call-stack" => Opt::CallStack,
        "collect-mode" => Opt::CollectMode,
        "device" => Opt::Device,
        "analysis" => Opt::Analysis,
        "format" => Opt::Format,
        "data-format" => return Some((Opt::Format, Some("--format"))),
        "watch" => Opt::Watch,
        "log-level" => Opt::LogLevel,
        "lib" => Opt::Lib,
        "ring-buffer-mib" => Opt::RingBuffer,
        "by-site" => Opt::BySite,
        "by-stack" => Opt::ByStack,
        "at" => Opt::At,
        "timeline" => Opt::Timeline,
        "report" => Opt::Report,
        "perfetto" => Opt::Perfetto,
        "as-root" => Opt::AsRoot,
        "max-file-mib" => Opt::MaxFileMib,
        "max-files" => Opt::MaxFiles,
        _ => return None,
    };
    Some((opt, None))
}

fn lookup_short(c: u8) -> Option<Opt> {
    Some(match c {
        b'h' => Opt::Help,
        b'V' => Opt::Version,
        b'v' => Opt::Verbose,
        b'q' => Opt::Quiet,
        b'i' => Opt::Input,
        b'o' => Opt::Output,
        _ => return None,
    })
}

// ---------------------------------------------------------------------------------------------
// Parser
// ---------------------------------------------------------------------------------------------

struct State {
    program: Option<(OsString, Vec<OsString>)>,
    pid: Option<u32>,
    compare: bool,
    /// `analyze` subcommand (first argument).
    analyze: bool,
    analyze_input: Option<PathBuf>,
    /// `report` subcommand (first argument).
    report: bool,
    report_inputs: Vec<PathBuf>,
    report_formats: Option<crate::report::Formats>,
    report_perfetto: bool,
    sites: crate::report::SitesRequest,
    report_at_end: Option<Option<PathBuf>>,
    inputs: Option<[PathBuf; 2]>,
    input_opt: String,
    output_dir: Option<PathBuf>,
    dump_events: EventSet,
    levels: Levels,
    devices: DeviceFilter,
    analysis: AnalysisSet,
    analysis_explicit: bool,
    steps: Vec<u32>,
    call_stack: CallStack,
    collect_mode: CollectMode,
    format: DataFormat,
    watch: Option<String>,
    explicit_log_level: Option<LogLevel>,
    verbose: bool,
    quiet: bool,
    libs: Vec<PathBuf>,
    ring_buffer_mib: u32,
    as_root: bool,
    max_file_mib: Option<u32>,
    max_files: Option<u32>,
    warnings: Vec<String>,
}

impl State {
    fn new() -> Self {
        State {
            program: None,
            pid: None,
            compare: false,
            analyze: false,
            analyze_input: None,
            report: false,
            report_inputs: Vec::new(),
            report_formats: None,
            report_perfetto: false,
            sites: crate::report::SitesRequest::default(),
            report_at_end: None,
            inputs: None,
            input_opt: String::new(),
            output_dir: None,
            dump_events: EventSet::CLI_DEFAULT,
            levels: Levels::default(),
            devices: DeviceFilter::default(),
            analysis: AnalysisSet::CLI_DEFAULT,
            analysis_explicit: false,
            steps: Vec::new(),
            call_stack: CallStack::default(),
            collect_mode: CollectMode::Immediate,
            format: DataFormat::Csv,
            watch: None,
            explicit_log_level: None,
            verbose: false,
            quiet: false,
            libs: Vec::new(),
            ring_buffer_mib: DEFAULT_RING_BUFFER_MIB,
            as_root: false,
            max_file_mib: None,
            max_files: None,
            warnings: Vec::new(),
        }
    }

    fn deprecated(&mut self, old: &str, new: &str) {
        self.warnings
            .push(format!("'{old}' is deprecated, use '{new}' instead"));
    }

    /// Apply one option. `opt_name` is the spelling the user typed (for messages).
    fn apply(&mut self, opt: Opt, opt_name: &str, value: Option<&OsStr>) -> Result<(), CliError> {
        let value_os = value.unwrap_or_default();
        if self.report
            && !matches!(
                opt,
                Opt::Help | Opt::Version | Opt::Verbose | Opt::Quiet | Opt::LogLevel
            )
        {
            return self.apply_report(opt, opt_name, value);
        }
        if self.analyze {
            match opt {
                Opt::Help
                | Opt::Version
                | Opt::Verbose
                | Opt::Quiet
                | Opt::Output
                | Opt::LogLevel => {}
                Opt::Input => {
                    self.analyze_input = Some(parse_analyze_input(opt_name, value_os)?);
                    return Ok(());
                }
                Opt::BySite => {
                    self.sites.by_site = true;
                    return Ok(());
                }
                Opt::ByStack => {
                    self.sites.by_stack = true;
                    return Ok(());
                }
                Opt::At => {
                    self.sites.at = Some(parse_at(opt_name, value_os)?);
                    return Ok(());
                }
                Opt::Timeline => {
                    self.sites.timeline_ms = Some(match value {
                        None => crate::report::model::DEFAULT_TIMELINE_MS,
                        Some(v) => parse_timeline_ms(opt_name, v)?,
                    });
                    return Ok(());
                }
                _ => {
                    return Err(CliError::usage(format!(
                        "{opt_name} cannot be used with 'analyze' (it takes --input-path=DUMP, \
                         --output-path, --by-site, --by-stack, --at, --timeline, --log-level, \
                         -v and -q)"
                    )));
                }
            }
        } else if matches!(opt, Opt::BySite | Opt::ByStack | Opt::At | Opt::Timeline) {
            return Err(CliError::usage(format!(
                "{opt_name} belongs to 'analyze': {PROGRAM_NAME} analyze -i DUMP {opt_name}"
            )));
        } else if opt == Opt::Perfetto {
            return Err(CliError::usage(format!(
                "{opt_name} belongs to 'report': {PROGRAM_NAME} report -i RUN --perfetto"
            )));
        }
        if opt == Opt::Report {
            self.report_at_end = Some(match value {
                None => None,
                Some(v) => Some(resolve_output_file(opt_name, v)?),
            });
            return Ok(());
        }
        // Options whose values are paths handle raw bytes themselves.
        match opt {
            Opt::Help => return Err(CliError::info(help_text())),
            Opt::Version => return Err(CliError::info(version_text())),
            Opt::Verbose => {
                self.verbose = true;
                return Ok(());
            }
            Opt::Quiet => {
                self.quiet = true;
                return Ok(());
            }
            Opt::AsRoot => {
                self.as_root = true;
                return Ok(());
            }
            Opt::Compare => {
                self.compare = true;
                return Ok(());
            }
            Opt::Output => {
                self.output_dir = Some(resolve_output(opt_name, value_os)?);
                return Ok(());
            }
            Opt::Input => {
                self.inputs = Some(parse_inputs(opt_name, value_os)?);
                self.input_opt = opt_name.to_owned();
                return Ok(());
            }
            Opt::Lib => {
                let lib = check_lib(opt_name, value_os)?;
                self.libs.push(lib);
                return Ok(());
            }
            _ => {}
        }
        let Some(v) = value_os.to_str() else {
            return Err(CliError::usage(format!(
                "invalid {opt_name} value '{}': not valid UTF-8",
                shown_os(value_os)
            )));
        };
        match opt {
            Opt::Pid => self.pid = Some(parse_pid(opt_name, v)?),
            Opt::Events => self.dump_events = self.parse_events(opt_name, v)?,
            Opt::Level => self.levels = self.parse_levels(opt_name, v)?,
            Opt::Steps => self.steps = parse_steps(opt_name, v)?,
            Opt::CallStack => self.call_stack = parse_call_stack(opt_name, v)?,
            Opt::CollectMode => {
                self.collect_mode = match v {
                    "immediate" => CollectMode::Immediate,
                    "deferred" => CollectMode::Deferred,
                    _ => return Err(invalid(opt_name, v, "expected immediate or deferred")),
                }
            }
            Opt::Device => self.devices = parse_devices(opt_name, v)?,
            Opt::Analysis => {
                self.analysis = self.parse_analysis(opt_name, v)?;
                self.analysis_explicit = true;
            }
            Opt::Format => {
                self.format = match v {
                    "csv" => DataFormat::Csv,
                    "db" => DataFormat::Db,
                    _ => return Err(invalid(opt_name, v, "expected csv or db")),
                }
            }
            Opt::Watch => {
                parse_watch(v)?;
                self.watch = Some(v.to_owned());
            }
            Opt::LogLevel => {
                let level = match v {
                    "debug" => LogLevel::Debug,
                    "info" => LogLevel::Info,
                    "warning" => LogLevel::Warning,
                    "warn" => {
                        self.deprecated("--log-level=warn", "--log-level=warning");
                        LogLevel::Warning
                    }
                    "error" => LogLevel::Error,
                    _ => {
                        return Err(invalid(
                            opt_name,
                            v,
                            "expected debug, info, warning or error",
                        ));
                    }
                };
                self.explicit_log_level = Some(level);
            }
            Opt::MaxFileMib => {
                self.max_file_mib = Some(
                    parse_decimal(v, false)
                        .filter(|n| *n <= 1 << 20)
                        .ok_or_else(|| invalid(opt_name, v, "expected MiB from 1 to 1048576"))?,
                );
            }
            Opt::MaxFiles => {
                self.max_files = Some(
                    parse_decimal(v, false)
                        .filter(|n| *n <= 10_000)
                        .ok_or_else(|| invalid(opt_name, v, "expected a count from 1 to 10000"))?,
                );
            }
            Opt::RingBuffer => {
                self.ring_buffer_mib = parse_decimal(v, false)
                    .filter(|n| n.is_power_of_two() && *n <= MAX_RING_BUFFER_MIB)
                    .ok_or_else(|| {
                        invalid(opt_name, v, "expected a power of two from 1 to 1024 (MiB)")
                    })?;
            }
            Opt::Help
            | Opt::Version
            | Opt::Verbose
            | Opt::Quiet
            | Opt::Compare
            | Opt::AsRoot
            | Opt::Output
            | Opt::Input
            | Opt::Lib
            | Opt::BySite
            | Opt::ByStack
            | Opt::At
            | Opt::Timeline
            | Opt::Report
            | Opt::Perfetto => {}
        }
        Ok(())
    }

    fn parse_events(&mut self, opt: &str, v: &str) -> Result<EventSet, CliError> {
        const EXPECTED: &str = "expected a list of alloc, free, launch, access, traceback or none";
        let tokens = split_list(v);
        if tokens.is_empty() {
            return Err(invalid(
                opt,
                v,
                &format!("{EXPECTED} (use 'none' for no events)"),
            ));
        }
        let mut set = EventSet::NONE;
        let mut none = false;
        let mut traceback = false;
        for t in &tokens {
            match *t {
                "alloc" => set.alloc = true,
                "free" => set.free = true,
                "launch" => set.launch = true,
                "access" => set.access = true,
                "traceback" => traceback = true,
                "none" => none = true,
                _ => {
                    return Err(CliError::usage(format!(
                        "invalid event trace type: {opt} value '{}' is not one of alloc, free, \
                         launch, access, traceback, none",
                        shown(t)
                    )));
                }
            }
        }
        if none {
            if tokens.len() > 1 {
                self.warnings.push(format!(
                    "{opt}: 'none' mixed with other event types, all events cleared"
                ));
            }
            return Ok(EventSet::NONE);
        }
        if traceback {
            self.warnings.push(format!(
                "{opt}: 'traceback' (Python function tracing) is not supported by \
                 {PROGRAM_NAME} and is ignored"
            ));
        }
        Ok(set)
    }

    fn parse_levels(&mut self, opt: &str, v: &str) -> Result<Levels, CliError> {
        let tokens = split_list(v);
        if tokens.is_empty() {
            return Err(invalid(
                opt,
                v,
                "invalid data trace level, expected op, kernel or op,kernel",
            ));
        }
        let mut levels = Levels {
            op: false,
            kernel: false,
        };
        for t in tokens {
            match t {
                "op" => levels.op = true,
                "kernel" => levels.kernel = true,
                "0" => {
                    self.deprecated("--level=0", "--level=op");
                    levels.op = true;
                }
                "1" => {
                    self.deprecated("--level=1", "--level=kernel");
                    levels.kernel = true;
                }
                _ => {
                    return Err(invalid(
                        opt,
                        t,
                        "invalid data trace level, expected op or kernel (a list like op,kernel is allowed)",
                    ));
                }
            }
        }
        Ok(levels)
    }

    fn parse_analysis(&mut self, opt: &str, v: &str) -> Result<AnalysisSet, CliError> {
        const EXPECTED: &str = "invalid analysis type, expected a list of leaks, decompose, inefficient, oom[:K] or none";
        let tokens = split_list(v);
        if tokens.is_empty() {
            return Err(invalid(
                opt,
                v,
                &format!("{EXPECTED} (use 'none' for no analysis)"),
            ));
        }
        let mut set = AnalysisSet::default();
        let mut none = false;
        for t in &tokens {
            match *t {
                "leaks" => set.leaks = true,
                "decompose" => set.decompose = true,
                "inefficient" => set.inefficient = true,
                "none" => none = true,
                "oom" => set.oom_top_k = Some(DEFAULT_OOM_TOP_K),
                _ => {
                    let Some(k) = t.strip_prefix("oom:") else {
                        return Err(invalid(opt, t, EXPECTED));
                    };
                    let k = parse_decimal(k, false)
                        .filter(|k| (1..=MAX_OOM_TOP_K).contains(k))
                        .ok_or_else(|| {
                            CliError::usage(format!(
                                "invalid {opt} value '{}': invalid OOM top-K value '{}', \
                                 expected an integer from 1 to {MAX_OOM_TOP_K} without leading zeros",
                                shown(t),
                                shown(k)
                            ))
                        })?;
                    set.oom_top_k = Some(k);
                }
            }
        }
        if none {
            if tokens.len() > 1 {
                self.warnings.push(format!(
                    "{opt}: 'none' mixed with other analysis types, all analyses cleared"
                ));
            }
            return Ok(AnalysisSet::default());
        }
        Ok(set)
    }

    /// The options of `report`.
    fn apply_report(
        &mut self,
        opt: Opt,
        opt_name: &str,
        value: Option<&OsStr>,
    ) -> Result<(), CliError> {
        let value_os = value.unwrap_or_default();
        match opt {
            Opt::Input => {
                self.report_inputs = parse_report_inputs(opt_name, value_os)?;
                Ok(())
            }
            Opt::Output => {
                self.output_dir = Some(resolve_output_file(opt_name, value_os)?);
                Ok(())
            }
            Opt::Perfetto => {
                self.report_perfetto = true;
                Ok(())
            }
            Opt::Format => {
                let v = value_os.to_str().unwrap_or("");
                let mut f = crate::report::Formats::default();
                for t in split_list(v) {
                    match t {
                        "html" => f.html = true,
                        "perfetto" => f.perfetto = true,
                        "folded" => f.folded = true,
                        "speedscope" => f.speedscope = true,
                        _ => {
                            return Err(invalid(
                                opt_name,
                                v,
                                "'report' writes html, perfetto, folded or speedscope (a list)",
                            ));
                        }
                    }
                }
                if f == crate::report::Formats::default() {
                    return Err(invalid(opt_name, v, "name at least one format"));
                }
                self.report_formats = Some(f);
                Ok(())
            }
            _ => Err(CliError::usage(format!(
                "{opt_name} cannot be used with 'report' (it takes --input-path=RUN[,RUN2], \
                 --output-path=FILE, --format, --perfetto, --log-level, -v and -q)"
            ))),
        }
    }

    fn finish(mut self) -> Result<Options, CliError> {
        let mode = if self.report {
            if let Some((program, _)) = self.program.take() {
                return Err(CliError::usage(format!(
                    "unexpected argument '{}': 'report' reads the run given with --input-path=RUN",
                    shown_os(&program)
                )));
            }
            if self.report_inputs.is_empty() {
                return Err(CliError::usage(
                    "report needs the run to draw: report --input-path=RUN_DIR|DUMP",
                ));
            }
            let mut formats = self.report_formats.unwrap_or(crate::report::Formats {
                html: true,
                ..Default::default()
            });
            formats.perfetto |= self.report_perfetto;
            if self.report_inputs.len() == 2 && !formats.html {
                return Err(CliError::usage(
                    "two runs are compared in the HTML report: add html to --format",
                ));
            }
            let output = match self.output_dir.take() {
                Some(p) => p,
                None => lexical_absolute(Path::new("memscope_report.html"), &current_dir()?),
            };
            Mode::Report {
                request: crate::report::ReportRequest {
                    inputs: std::mem::take(&mut self.report_inputs),
                    output,
                    formats,
                },
            }
        } else if self.analyze {
            if let Some((program, _)) = self.program.take() {
                return Err(CliError::usage(format!(
                    "unexpected argument '{}': 'analyze' reads the dump given with --input-path=DUMP \
                     (to launch a program named analyze, write '{PROGRAM_NAME} -- analyze')",
                    shown_os(&program)
                )));
            }
            match self.analyze_input.take() {
                Some(input) => Mode::Analyze { input },
                None => {
                    return Err(CliError::usage(
                        "analyze needs the dump to read: analyze --input-path=DUMP",
                    ));
                }
            }
        } else {
            self.launch_mode()?
        };
        self.finish_options(mode)
    }

    fn launch_mode(&mut self) -> Result<Mode, CliError> {
        let mode = match (self.program.take(), self.pid, self.compare) {
            (Some(_), Some(_), _) => {
                return Err(CliError::usage(
                    "--pid cannot be combined with a program to launch; use one or the other",
                ));
            }
            (_, Some(_), true) => {
                return Err(CliError::usage(
                    "--pid and --compare cannot be used together",
                ));
            }
            (Some((program, _)), None, true) => {
                return Err(CliError::usage(format!(
                    "--compare runs no program, but '{}' was given",
                    shown_os(&program)
                )));
            }
            (None, None, true) => match self.inputs.take() {
                Some(inputs) => Mode::Compare { inputs },
                None => {
                    return Err(CliError::usage(
                        "--compare needs two dump files: --input-path=<A>,<B>",
                    ));
                }
            },
            (Some((program, args)), None, false) => Mode::Launch { program, args },
            (None, Some(pid), false) => Mode::Attach { pid },
            (None, None, false) => {
                if self.inputs.is_some() {
                    return Err(input_without_compare(&self.input_opt));
                }
                return Err(no_target_error());
            }
        };
        if self.inputs.is_some() {
            return Err(input_without_compare(&self.input_opt));
        }
        Ok(mode)
    }

    fn finish_options(mut self, mode: Mode) -> Result<Options, CliError> {
        if self.max_files.is_some() && self.max_file_mib.is_none() {
            return Err(CliError::usage(
                "--max-files needs --max-file-mib (files are only rotated by size)".to_string(),
            ));
        }
        if self.max_file_mib.is_some() && self.format == DataFormat::Db {
            return Err(CliError::usage(
                "--max-file-mib rotates CSV dumps; it cannot be used with --format=db".to_string(),
            ));
        }
        let output_dir = match self.output_dir.take() {
            Some(d) => d,
            None => default_output_dir()?,
        };

        let mut analysis = self.analysis;
        if !self.steps.is_empty() && analysis.leaks {
            analysis.leaks = false;
            if self.analysis_explicit {
                self.warnings
                    .push("leak analysis is turned off because --steps is given".to_owned());
            }
        }

        let events = self
            .dump_events
            .with_implied()
            .union(analysis.implied_events());

        let log_level = match self.explicit_log_level {
            Some(l) => l,
            None if self.verbose => LogLevel::Debug,
            None if self.quiet => LogLevel::Error,
            None => LogLevel::Info,
        };

        Ok(Options {
            mode,
            output_dir,
            events,
            dump_events: self.dump_events,
            levels: self.levels,
            devices: self.devices,
            analysis,
            steps: self.steps,
            call_stack: self.call_stack,
            collect_mode: self.collect_mode,
            format: self.format,
            watch: self.watch,
            log_level,
            libs: self.libs,
            ring_buffer_mib: self.ring_buffer_mib,
            as_root: self.as_root,
            max_file_mib: self.max_file_mib,
            max_files: self.max_files,
            warnings: self.warnings,
            sites: self.sites,
            report_at_end: self.report_at_end,
        })
    }
}

fn input_without_compare(opt: &str) -> CliError {
    CliError::usage(format!("{opt} is only used together with --compare"))
}

fn parse_pid(opt: &str, v: &str) -> Result<u32, CliError> {
    let pid = parse_decimal(v, false).filter(|&p| p > 0).ok_or_else(|| {
        invalid(
            opt,
            v,
            "expected a process id: a positive decimal integer without sign or leading zeros",
        )
    })?;
    if pid == std::process::id() {
        return Err(CliError::usage(format!(
            "invalid {opt} value '{pid}': that is {PROGRAM_NAME} itself"
        )));
    }
    if std::fs::symlink_metadata(format!("/proc/{pid}")).is_err() {
        return Err(CliError::usage(format!("no process with pid {pid}")));
    }
    Ok(pid)
}

fn parse_steps(opt: &str, v: &str) -> Result<Vec<u32>, CliError> {
    let tokens = split_list(v);
    if tokens.is_empty() {
        return Err(invalid(
            opt,
            v,
            "invalid steps, expected a list of step numbers >= 1",
        ));
    }
    if tokens.len() > MAX_STEPS {
        return Err(invalid(
            opt,
            v,
            &format!("invalid steps, at most {MAX_STEPS} steps may be given"),
        ));
    }
    tokens
        .into_iter()
        .map(|t| {
            parse_decimal(t, false).ok_or_else(|| {
                invalid(
                    opt,
                    t,
                    "invalid steps, expected an integer >= 1 without sign or leading zeros that fits 32 bits",
                )
            })
        })
        .collect()
}

fn parse_call_stack(opt: &str, v: &str) -> Result<CallStack, CliError> {
    let mut cs = CallStack::default();
    for t in split_list(v) {
        let (kind, depth) = match t.split_once(':') {
            Some((k, d)) => {
                let depth = parse_decimal(d, true)
                    .filter(|d| *d <= MAX_CALL_STACK_DEPTH)
                    .ok_or_else(|| {
                        invalid(
                            opt,
                            t,
                            "invalid call-stack depth, expected c[:DEPTH] or python[:DEPTH] \
                             with DEPTH from 0 to 1000 without leading zeros",
                        )
                    })?;
                (k, depth)
            }
            None => (t, DEFAULT_CALL_STACK_DEPTH),
        };
        match kind {
            "c" => cs.c_depth = Some(depth),
            "python" => cs.python_depth = Some(depth),
            "mixed" => {
                cs.c_depth = Some(depth);
                cs.python_depth = Some(cs.python_depth.unwrap_or(depth));
                cs.mixed = true;
            }
            _ => {
                return Err(invalid(
                    opt,
                    t,
                    "expected c[:DEPTH], python[:DEPTH] or mixed[:DEPTH] (an empty value \
                     disables stacks)",
                ));
            }
        }
    }
    Ok(cs)
}

fn parse_devices(opt: &str, v: &str) -> Result<DeviceFilter, CliError> {
    const EXPECTED: &str = "expected npu, cpu or npu:N with N < 32";
    let mut d = DeviceFilter {
        all_npu: false,
        npu_mask: 0,
        cpu: false,
    };
    let tokens = split_list(v);
    if tokens.is_empty() {
        return Err(invalid(
            opt,
            v,
            &format!("{EXPECTED} (at least one device)"),
        ));
    }
    for t in tokens {
        match t {
            "npu" => d.all_npu = true,
            "cpu" => d.cpu = true,
            _ => {
                let n = t
                    .strip_prefix("npu:")
                    .and_then(parse_c_number)
                    .filter(|n| *n < MAX_NPU_SLOTS)
                    .ok_or_else(|| invalid(opt, t, EXPECTED))?;
                d.npu_mask |= 1 << n;
            }
        }
    }
    Ok(d)
}

/// `report --input-path`: one or two runs, each an existing directory or dump file (not a
/// symlink).
fn parse_report_inputs(opt: &str, v: &OsStr) -> Result<Vec<PathBuf>, CliError> {
    if v.len() > 2 * MAX_PATH_LEN {
        return Err(CliError::usage(format!(
            "invalid {opt} value: it is {} bytes long, more than {}",
            v.len(),
            2 * MAX_PATH_LEN
        )));
    }
    let tokens = split_list_os(v);
    if tokens.is_empty() || tokens.len() > 2 {
        return Err(CliError::usage(format!(
            "invalid {opt} value '{}': 'report' takes one run, or two to compare, got {}",
            shown_os(v),
            tokens.len()
        )));
    }
    tokens
        .into_iter()
        .map(|t| {
            let path = PathBuf::from(t);
            match std::fs::symlink_metadata(&path) {
                Ok(md) if md.is_dir() => Ok(path),
                Ok(_) => check_input_file(opt, v, t),
                Err(e) => Err(CliError::usage(format!(
                    "invalid {opt} value '{}': cannot read '{}': {e}",
                    shown_os(v),
                    shown_os(t)
                ))),
            }
        })
        .collect()
}

/// An output file path: UTF-8, not empty, not a directory or a symlink.
fn resolve_output_file(opt: &str, raw: &OsStr) -> Result<PathBuf, CliError> {
    let Some(value) = raw.to_str().filter(|v| !v.trim().is_empty()) else {
        return Err(CliError::usage(format!(
            "invalid {opt} value '{}': expected a file name (UTF-8, not empty)",
            shown_os(raw)
        )));
    };
    if value.len() > MAX_PATH_LEN {
        return Err(CliError::usage(format!(
            "invalid {opt} value: it is {} bytes long, more than {MAX_PATH_LEN}",
            value.len()
        )));
    }
    let abs = lexical_absolute(Path::new(value), &current_dir()?);
    match std::fs::symlink_metadata(&abs) {
        Ok(md) if md.is_dir() => Err(invalid(
            opt,
            value,
            "is a directory; name the file to write, e.g. DIR/report.html",
        )),
        Ok(md) if md.file_type().is_symlink() => Err(invalid(
            opt,
            value,
            "is a symbolic link; name the file itself",
        )),
        _ => Ok(abs),
    }
}

/// `--at=exit|peak|SECONDS`.
fn parse_at(opt: &str, v: &OsStr) -> Result<crate::report::At, CliError> {
    let v = v.to_str().unwrap_or("");
    Ok(match v {
        "exit" | "end" => crate::report::At::Exit,
        "peak" => crate::report::At::Peak,
        _ => match v.parse::<f64>() {
            Ok(s) if (0.0..1e9).contains(&s) => crate::report::At::After((s * 1e9).round() as u64),
            _ => {
                return Err(invalid(
                    opt,
                    v,
                    "expected exit, peak or seconds after the dump's first event (e.g. 1.5)",
                ));
            }
        },
    })
}

/// `--timeline=MS`: 1 ms to one hour.
fn parse_timeline_ms(opt: &str, v: &OsStr) -> Result<u64, CliError> {
    let v = v.to_str().unwrap_or("");
    parse_decimal(v, false)
        .map(u64::from)
        .filter(|ms| (1..=3_600_000).contains(ms))
        .ok_or_else(|| invalid(opt, v, "expected an interval in milliseconds, 1..=3600000"))
}

/// `analyze --input-path`: exactly one dump file, under the same rules as the compare inputs.
fn parse_analyze_input(opt: &str, v: &OsStr) -> Result<PathBuf, CliError> {
    if v.len() > MAX_PATH_LEN {
        return Err(CliError::usage(format!(
            "invalid {opt} value: it is {} bytes long, more than {MAX_PATH_LEN}",
            v.len()
        )));
    }
    let tokens = split_list_os(v);
    if tokens.len() != 1 {
        return Err(CliError::usage(format!(
            "invalid {opt} value '{}': 'analyze' takes exactly one dump file, got {}",
            shown_os(v),
            tokens.len()
        )));
    }
    check_input_file(opt, v, tokens[0])
}

/// One input dump: exists, a regular file (a symlink is refused, not followed), at most
/// 8 GiB, readable.
fn check_input_file(opt: &str, whole: &OsStr, t: &OsStr) -> Result<PathBuf, CliError> {
    let path = PathBuf::from(t);
    let bad = |why: &str| {
        CliError::usage(format!(
            "invalid {opt} value '{}': invalid paths, '{}' {why}",
            shown_os(whole),
            shown_os(t)
        ))
    };
    let md = std::fs::symlink_metadata(&path).map_err(|e| bad(&format!("cannot be read: {e}")))?;
    if md.file_type().is_symlink() {
        return Err(bad("is a symbolic link; give the file itself"));
    }
    if !md.is_file() {
        return Err(bad("is not a regular file"));
    }
    if md.len() > MAX_COMPARE_INPUT_BYTES {
        return Err(bad("is larger than 8 GiB"));
    }
    if !is_readable(&path) {
        return Err(bad("is not readable"));
    }
    Ok(path)
}

fn parse_inputs(opt: &str, v: &OsStr) -> Result<[PathBuf; 2], CliError> {
    const EXPECTED: &str = "invalid paths, expected exactly two comma-separated dump files";
    if v.len() > MAX_PATH_LEN {
        return Err(CliError::usage(format!(
            "invalid {opt} value: it is {} bytes long, more than {MAX_PATH_LEN}",
            v.len()
        )));
    }
    let tokens = split_list_os(v);
    if tokens.len() != 2 {
        return Err(CliError::usage(format!(
            "invalid {opt} value '{}': {EXPECTED}, got {}",
            shown_os(v),
            tokens.len()
        )));
    }
    let mut out: [PathBuf; 2] = Default::default();
    for (slot, t) in out.iter_mut().zip(tokens) {
        *slot = check_input_file(opt, v, t)?;
    }
    Ok(out)
}

fn check_lib(opt: &str, v: &OsStr) -> Result<PathBuf, CliError> {
    let bad = |why: &str| {
        CliError::usage(format!(
            "invalid {opt} value '{}': {why}; expected an existing, readable shared library file",
            shown_os(v)
        ))
    };
    if v.is_empty() {
        return Err(bad("empty path"));
    }
    let path = std::fs::canonicalize(v).map_err(|e| bad(&e.to_string()))?;
    let md = std::fs::metadata(&path).map_err(|e| bad(&e.to_string()))?;
    if !md.is_file() {
        return Err(bad("not a regular file"));
    }
    if !is_readable(&path) {
        return Err(bad("not readable"));
    }
    // A library named on the command line that cannot be probed is a mistake the user
    // should hear about now, not a warning scrolled past after the target has started.
    let mut header = [0u8; 18];
    std::fs::File::open(&path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut header))
        .map_err(|e| bad(&format!("cannot read its ELF header: {e}")))?;
    if &header[..4] != b"\x7fELF" {
        return Err(bad("not an ELF file"));
    }
    if header[4] != 2 {
        return Err(bad("not a 64-bit ELF file"));
    }
    const ET_DYN: u16 = 3;
    let e_type = match header[5] {
        1 => u16::from_le_bytes([header[16], header[17]]),
        _ => u16::from_be_bytes([header[16], header[17]]),
    };
    if e_type != ET_DYN {
        return Err(bad("an ELF file but not a shared object"));
    }
    Ok(path)
}

/// Parse the command line. `args[0]` is the program name.
///
/// Returns `Err` with `exit_code` 0 for `--help`/`--version` (the text goes to stdout) and with
/// `exit_code` 2 for usage errors.
pub fn parse_from<I, T>(args: I) -> Result<Options, CliError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let argv: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let mut st = State::new();
    let mut i = 1;
    if argv.get(1).is_some_and(|a| a == "analyze") {
        st.analyze = true;
        i = 2;
    } else if argv.get(1).is_some_and(|a| a == "report") {
        st.report = true;
        i = 2;
    }
    while i < argv.len() {
        let arg = argv[i].as_os_str();
        let bytes = arg.as_bytes();
        i += 1;
        if bytes == b"--" {
            let Some(program) = argv.get(i) else {
                return Err(CliError::usage(format!(
                    "'--' must be followed by the program to launch (see '{PROGRAM_NAME} --help')"
                )));
            };
            st.program = Some((program.clone(), argv[i + 1..].to_vec()));
            break;
        }
        if let Some(body) = bytes.strip_prefix(b"--") {
            let (name_bytes, inline) = match body.iter().position(|&b| b == b'=') {
                Some(eq) => (&body[..eq], Some(OsStr::from_bytes(&body[eq + 1..]))),
                None => (body, None),
            };
            let found = std::str::from_utf8(name_bytes)
                .ok()
                .and_then(|n| lookup_long(n).map(|(opt, dep)| (opt, format!("--{n}"), dep)));
            let Some((opt, name, deprecated)) = found else {
                return Err(CliError::usage(format!(
                    "unrecognized option '{}' (see '{PROGRAM_NAME} --help')",
                    shown_os(OsStr::from_bytes(match inline {
                        Some(_) => &bytes[..2 + name_bytes.len()],
                        None => bytes,
                    }))
                )));
            };
            if let Some(new) = deprecated {
                st.deprecated(&name, new);
            }
            let value = if opt.takes_value() {
                match inline {
                    Some(v) => Some(v),
                    None => match argv.get(i) {
                        Some(v) => {
                            i += 1;
                            Some(v.as_os_str())
                        }
                        None => {
                            return Err(CliError::usage(format!(
                                "option '{name}' requires a value (see '{PROGRAM_NAME} --help')"
                            )));
                        }
                    },
                }
            } else {
                if inline.is_some() && !opt.optional_value() {
                    return Err(CliError::usage(format!("option '{name}' takes no value")));
                }
                inline
            };
            st.apply(opt, &name, value)?;
            continue;
        }
        if bytes.len() > 1 && bytes[0] == b'-' {
            // A cluster of short options, e.g. -vq or -o DIR or -oDIR.
            let mut j = 1;
            while j < bytes.len() {
                let c = bytes[j];
                j += 1;
                let Some(opt) = lookup_short(c) else {
                    let shown_c = if c.is_ascii_graphic() {
                        (c as char).to_string()
                    } else {
                        format!("\\x{c:02x}")
                    };
                    return Err(CliError::usage(format!(
                        "unrecognized option '-{shown_c}' (see '{PROGRAM_NAME} --help')"
                    )));
                };
                let name = format!("-{}", c as char);
                if opt.takes_value() {
                    let value = if j < bytes.len() {
                        OsStr::from_bytes(&bytes[j..])
                    } else {
                        match argv.get(i) {
                            Some(v) => {
                                i += 1;
                                v.as_os_str()
                            }
                            None => {
                                return Err(CliError::usage(format!(
                                    "option '{name}' requires a value (see '{PROGRAM_NAME} --help')"
                                )));
                            }
                        }
                    };
                    st.apply(opt, &name, Some(value))?;
                    break;
                }
                st.apply(opt, &name, None)?;
            }
            continue;
        }
        // First non-option argument: the program; everything after it is its arguments.
        st.program = Some((arg.to_os_string(), argv[i..].to_vec()));
        break;
    }
    st.finish()
}

// ---------------------------------------------------------------------------------------------
// config.json
// ---------------------------------------------------------------------------------------------

enum Json {
    Bool(bool),
    Num(u64),
    Str(String),
    Arr(Vec<Json>),
    Obj(BTreeMap<&'static str, Json>),
}

fn json_escape(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// nlohmann::json `dump(4)` layout: 4-space indent, `"key": value`, keys in byte order.
fn json_write(v: &Json, indent: usize, out: &mut String) {
    const STEP: usize = 4;
    match v {
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Num(n) => out.push_str(&n.to_string()),
        Json::Str(s) => json_escape(s, out),
        Json::Arr(items) if items.is_empty() => out.push_str("[]"),
        Json::Obj(map) if map.is_empty() => out.push_str("{}"),
        Json::Arr(items) => {
            out.push_str("[\n");
            for (n, item) in items.iter().enumerate() {
                out.push_str(&" ".repeat(indent + STEP));
                json_write(item, indent + STEP, out);
                out.push_str(if n + 1 < items.len() { ",\n" } else { "\n" });
            }
            out.push_str(&" ".repeat(indent));
            out.push(']');
        }
        Json::Obj(map) => {
            out.push_str("{\n");
            for (n, (k, item)) in map.iter().enumerate() {
                out.push_str(&" ".repeat(indent + STEP));
                json_escape(k, out);
                out.push_str(": ");
                json_write(item, indent + STEP, out);
                out.push_str(if n + 1 < map.len() { ",\n" } else { "\n" });
            }
            out.push_str(&" ".repeat(indent));
            out.push('}');
        }
    }
}

/// The msMemScope `config.json` for these options (spec §3.7), laid out like nlohmann::json's
/// `dump(4)`: keys sorted, 4-space indent, no trailing newline.
pub fn config_json(opts: &Options) -> String {
    let mut steps = [0u64; MAX_STEPS];
    for (slot, s) in steps.iter_mut().zip(&opts.steps) {
        *slot = u64::from(*s);
    }
    let step_count = opts.steps.len().min(MAX_STEPS) as u64;
    let step_list = BTreeMap::from([
        (
            "stepIdList",
            Json::Arr(steps.iter().map(|&s| Json::Num(s)).collect()),
        ),
        ("stepCount", Json::Num(step_count)),
    ]);

    let watch = opts.watch_config();
    let watch_obj = BTreeMap::from([
        ("isWatched", Json::Bool(watch.is_some())),
        (
            "fullContent",
            Json::Bool(watch.as_ref().is_some_and(|w| w.full_content)),
        ),
        (
            "start",
            Json::Str(
                watch
                    .as_ref()
                    .and_then(|w| w.start.clone())
                    .unwrap_or_default(),
            ),
        ),
        (
            "end",
            Json::Str(watch.as_ref().map(|w| w.end.clone()).unwrap_or_default()),
        ),
        (
            "outputId",
            Json::Num(u64::from(
                watch
                    .as_ref()
                    .and_then(|w| w.output_id)
                    .unwrap_or(WATCH_NO_OUTPUT_ID),
            )),
        ),
    ]);

    let cs = opts.call_stack;
    let root = BTreeMap::from([
        ("enableCStack", Json::Bool(cs.c_depth.is_some())),
        ("enablePyStack", Json::Bool(cs.python_depth.is_some())),
        (
            "enableCompare",
            Json::Bool(matches!(opts.mode, Mode::Compare { .. })),
        ),
        ("cStackDepth", Json::Num(u64::from(cs.c_depth.unwrap_or(0)))),
        (
            "pyStackDepth",
            Json::Num(u64::from(cs.python_depth.unwrap_or(0))),
        ),
        ("levelType", Json::Num(u64::from(opts.levels.bits()))),
        ("eventType", Json::Num(u64::from(opts.events.bits()))),
        (
            "dumpEventType",
            Json::Num(u64::from(opts.dump_events.bits())),
        ),
        ("analysisType", Json::Num(u64::from(opts.analysis.bits()))),
        (
            "oomTopK",
            Json::Num(u64::from(
                opts.analysis.oom_top_k.unwrap_or(DEFAULT_OOM_TOP_K),
            )),
        ),
        (
            "collectMode",
            Json::Num(u64::from(opts.collect_mode.config_value())),
        ),
        (
            "outputDir",
            Json::Str(opts.output_dir.to_string_lossy().into_owned()),
        ),
        (
            "dataFormat",
            Json::Num(u64::from(opts.format.config_value())),
        ),
        ("collectAllNpu", Json::Bool(opts.devices.all_npu)),
        ("collectCpu", Json::Bool(opts.devices.cpu)),
        ("npuSlots", Json::Num(u64::from(opts.devices.npu_mask))),
        (
            "logLevel",
            Json::Num(u64::from(opts.log_level.config_value())),
        ),
        ("isEffective", Json::Bool(true)),
        ("SelectedStepList", Json::Obj(step_list)),
        ("watchConfig", Json::Obj(watch_obj)),
    ]);
    let mut out = String::new();
    json_write(&Json::Obj(root), 0, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn parse(args: &[&str]) -> Result<Options, CliError> {
        let mut v = vec![PROGRAM_NAME];
        v.extend_from_slice(args);
        parse_from(v)
    }

    fn ok(args: &[&str]) -> Options {
        match parse(args) {
            Ok(o) => o,
            Err(e) => panic!("{args:?} failed: {e}"),
        }
    }

    fn err(args: &[&str]) -> CliError {
        match parse(args) {
            Ok(o) => panic!("{args:?} unexpectedly parsed: {o:?}"),
            Err(e) => e,
        }
    }

    /// Assert a usage error (exit 2) whose message contains every fragment.
    fn usage_err(args: &[&str], fragments: &[&str]) {
        let e = err(args);
        assert_eq!(e.exit_code, 2, "{args:?}: {e}");
        for f in fragments {
            assert!(
                e.message.contains(f),
                "{args:?}: {:?} lacks {f:?}",
                e.message
            );
        }
    }

    /// Launch `true` with extra options.
    fn launch(opts: &[&str]) -> Options {
        let mut v = opts.to_vec();
        v.extend_from_slice(&["--", "true"]);
        ok(&v)
    }

    fn launch_err(opts: &[&str], fragments: &[&str]) {
        let mut v = opts.to_vec();
        v.extend_from_slice(&["--", "true"]);
        usage_err(&v, fragments);
    }

    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> Self {
            static N: AtomicUsize = AtomicUsize::new(0);
            let p = std::env::temp_dir().join(format!(
                "memscope_cli_test_{}_{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
        fn file(&self, name: &str, contents: &[u8]) -> String {
            let p = self.0.join(name);
            std::fs::write(&p, contents).unwrap();
            p.to_str().unwrap().to_owned()
        }
        fn path(&self, name: &str) -> String {
            self.0.join(name).to_str().unwrap().to_owned()
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn os(s: &str) -> OsString {
        OsString::from(s)
    }

    // ----- defaults -----------------------------------------------------------------------

    #[test]
    fn defaults() {
        let o = ok(&["--", "python", "train.py"]);
        assert_eq!(
            o.mode,
            Mode::Launch {
                program: os("python"),
                args: vec![os("train.py")]
            }
        );
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(o.output_dir, cwd.join("memscopeDumpResults"));
        assert_eq!(o.dump_events, EventSet::CLI_DEFAULT);
        assert_eq!(o.events, EventSet::CLI_DEFAULT);
        assert_eq!(
            o.levels,
            Levels {
                op: true,
                kernel: false
            }
        );
        assert_eq!(
            o.devices,
            DeviceFilter {
                all_npu: true,
                npu_mask: 0,
                cpu: false
            }
        );
        assert_eq!(o.analysis, AnalysisSet::CLI_DEFAULT);
        assert!(o.analysis.leaks && o.analysis.oom_top_k.is_none());
        assert!(o.steps.is_empty());
        assert_eq!(
            o.call_stack,
            CallStack {
                c_depth: None,
                python_depth: None,
                mixed: false
            }
        );
        assert_eq!(o.collect_mode, CollectMode::Immediate);
        assert_eq!(o.format, DataFormat::Csv);
        assert_eq!(o.watch, None);
        assert_eq!(o.log_level, LogLevel::Info);
        assert!(o.libs.is_empty());
        assert_eq!(o.ring_buffer_mib, 64);
        assert!(o.warnings.is_empty());
    }

    // ----- target selection -------------------------------------------------------------

    #[test]
    fn launch_without_double_dash_keeps_program_flags() {
        let o = ok(&[
            "--level=op",
            "bash",
            "run.sh",
            "--level=kernel",
            "-h",
            "--",
            "x",
        ]);
        assert_eq!(
            o.mode,
            Mode::Launch {
                program: os("bash"),
                args: vec![
                    os("run.sh"),
                    os("--level=kernel"),
                    os("-h"),
                    os("--"),
                    os("x")
                ]
            }
        );
        assert_eq!(
            o.levels,
            Levels {
                op: true,
                kernel: false
            }
        );
    }

    #[test]
    fn launch_after_double_dash_program_may_look_like_option() {
        let o = ok(&["--", "--weird", "-v"]);
        assert_eq!(
            o.mode,
            Mode::Launch {
                program: os("--weird"),
                args: vec![os("-v")]
            }
        );
        assert_eq!(o.log_level, LogLevel::Info);
    }

    #[test]
    fn non_utf8_program_args_pass_through() {
        let bad = OsString::from_vec(vec![0x66, 0xff, 0xfe, 0x41]);
        let o = parse_from(vec![os(PROGRAM_NAME), os("-q"), bad.clone(), bad.clone()]).unwrap();
        assert_eq!(
            o.mode,
            Mode::Launch {
                program: bad.clone(),
                args: vec![bad]
            }
        );
    }

    #[test]
    fn non_utf8_option_values_are_errors_not_panics() {
        let bad = OsString::from_vec(vec![
            b'-', b'-', b'e', b'v', b'e', b'n', b't', b's', b'=', 0xff,
        ]);
        let e = parse_from(vec![os(PROGRAM_NAME), bad, os("true")]).unwrap_err();
        assert_eq!(e.exit_code, 2);
        assert!(e.message.contains("not valid UTF-8"), "{e}");
        let bad_name = OsString::from_vec(vec![b'-', b'-', 0xff]);
        let e = parse_from(vec![os(PROGRAM_NAME), bad_name, os("true")]).unwrap_err();
        assert!(e.message.contains("unrecognized option"), "{e}");
        let bad_short = OsString::from_vec(vec![b'-', 0xff]);
        let e = parse_from(vec![os(PROGRAM_NAME), bad_short, os("true")]).unwrap_err();
        assert!(e.message.contains("\\xff"), "{e}");
        let bad_out = OsString::from_vec(vec![b'/', b't', 0xff]);
        let e = parse_from(vec![os(PROGRAM_NAME), os("-o"), bad_out, os("true")]).unwrap_err();
        assert!(e.message.contains("invalid output path"), "{e}");
    }

    #[test]
    fn no_target_is_error_with_help_hint() {
        usage_err(&[], &["--help"]);
        usage_err(&["--level=op"], &["--pid", "--compare", "--help"]);
        assert!(!err(&[]).message.contains('\n'));
        usage_err(&["--"], &["'--' must be followed"]);
    }

    #[test]
    fn empty_argv_does_not_panic() {
        let e = parse_from(Vec::<OsString>::new()).unwrap_err();
        assert_eq!(e.exit_code, 2);
    }

    #[test]
    fn pid_attach() {
        // pid 1 always exists in a Linux pid namespace.
        let o = ok(&["--pid", "1", "--level=kernel"]);
        assert_eq!(o.mode, Mode::Attach { pid: 1 });
        let o = ok(&["--pid=1"]);
        assert_eq!(o.mode, Mode::Attach { pid: 1 });
    }

    #[test]
    fn rotation_and_as_root_options() {
        let o = ok(&["--max-file-mib=80", "--max-files", "10", "--", "true"]);
        assert_eq!((o.max_file_mib, o.max_files), (Some(80), Some(10)));
        let o = ok(&["--", "true"]);
        assert_eq!(
            (o.max_file_mib, o.max_files, o.as_root),
            (None, None, false)
        );
        assert!(ok(&["--as-root", "--", "true"]).as_root);
        usage_err(
            &["--max-files=3", "--", "true"],
            &["--max-files needs --max-file-mib"],
        );
        usage_err(
            &["--max-file-mib=0", "--", "true"],
            &["--max-file-mib", "1 to 1048576"],
        );
        usage_err(
            &["--max-files=0", "--max-file-mib=1", "--", "true"],
            &["1 to 10000"],
        );
        usage_err(
            &["--max-file-mib=1", "--format=db", "--", "true"],
            &["--format=db"],
        );
        usage_err(&["--as-root=yes", "--", "true"], &["--as-root"]);
    }

    #[test]
    fn pid_errors() {
        for bad in [
            "0",
            "-1",
            "+1",
            "01",
            "abc",
            "",
            "1.5",
            " 1",
            "4294967296",
            "99999999999",
        ] {
            usage_err(&["--pid", bad], &["--pid", "positive decimal"]);
        }
        usage_err(
            &["--pid", "4000000000"],
            &["no process with pid 4000000000"],
        );
        let me = std::process::id().to_string();
        usage_err(&["--pid", &me], &["itself"]);
        usage_err(&["--pid"], &["requires a value"]);
    }

    #[test]
    fn pid_with_program_or_compare_is_error() {
        usage_err(&["--pid", "1", "--", "true"], &["--pid", "program"]);
        usage_err(&["--pid", "1", "bash"], &["--pid"]);
        let t = TempDir::new();
        let a = t.file("a.csv", b"x");
        let b = t.file("b.csv", b"y");
        usage_err(
            &["--pid", "1", "--compare", "-i", &format!("{a},{b}")],
            &["--compare"],
        );
    }

    #[test]
    fn compare_mode() {
        let t = TempDir::new();
        let a = t.file("a.csv", b"x");
        let b = t.file("b.csv", b"y");
        for args in [
            vec!["--compare".to_owned(), format!("--input={a},{b}")],
            vec!["--compare".to_owned(), "-i".to_owned(), format!("{a},{b}")],
            vec!["--compare".to_owned(), format!("-i{a},{b}")],
            vec![
                "--compare".to_owned(),
                format!("--input-path={a}\u{ff0c}{b}"),
            ],
            vec![format!("--input-path={a},,{b},"), "--compare".to_owned()],
        ] {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            let o = ok(&refs);
            assert_eq!(
                o.mode,
                Mode::Compare {
                    inputs: [PathBuf::from(&a), PathBuf::from(&b)]
                },
                "{args:?}"
            );
        }
        let o = ok(&["--compare", &format!("--input={a},{b}")]);
        assert!(
            o.warnings
                .iter()
                .any(|w| w.contains("'--input' is deprecated"))
        );
        assert!(config_json(&o).contains("\"enableCompare\": true"));
    }

    #[test]
    fn compare_errors() {
        let t = TempDir::new();
        let a = t.file("a.csv", b"x");
        let b = t.file("b.csv", b"y");
        let c = t.file("c.csv", b"z");
        usage_err(&["--compare"], &["--compare", "--input-path"]);
        usage_err(
            &["-i", &format!("{a},{b}"), "--", "true"],
            &["-i", "--compare"],
        );
        usage_err(
            &["--input-path", &format!("{a},{b}")],
            &["--input-path", "--compare"],
        );
        usage_err(
            &["--compare", "-i", &format!("{a},{b}"), "true"],
            &["--compare", "true"],
        );
        usage_err(&["--compare", "-i", &a], &["exactly two", "got 1"]);
        usage_err(
            &["--compare", "-i", &format!("{a},{b},{c}")],
            &["exactly two", "got 3"],
        );
        usage_err(&["--compare", "-i", ""], &["got 0"]);
        let missing = t.path("missing.csv");
        usage_err(
            &["--compare", "-i", &format!("{a},{missing}")],
            &["missing.csv", "cannot be read"],
        );
        usage_err(
            &["--compare", "-i", &format!("{a},{}", t.0.display())],
            &["not a regular file"],
        );
        let link = t.path("link.csv");
        std::os::unix::fs::symlink(&a, &link).unwrap();
        usage_err(
            &["--compare", "-i", &format!("{link},{b}")],
            &["symbolic link"],
        );
        let long = format!("{a},{}", "x".repeat(5000));
        usage_err(&["--compare", "-i", &long], &["4096"]);
        usage_err(&["--compare", "-i"], &["requires a value"]);
    }

    #[test]
    fn analyze_mode() {
        let t = TempDir::new();
        let a = t.file("a.csv", b"x");
        for args in [
            vec!["analyze".to_owned(), format!("--input={a}")],
            vec!["analyze".to_owned(), format!("--input-path={a}")],
            vec!["analyze".to_owned(), "-i".to_owned(), a.clone()],
            vec!["analyze".to_owned(), format!("-i{a}")],
            vec![
                "analyze".to_owned(),
                "-q".to_owned(),
                format!("-i{a},"),
                "--log-level=debug".to_owned(),
            ],
        ] {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            let o = ok(&refs);
            assert_eq!(
                o.mode,
                Mode::Analyze {
                    input: PathBuf::from(&a)
                },
                "{args:?}"
            );
        }
        let out = t.path("out");
        let o = ok(&["analyze", "-i", &a, "-o", &out]);
        assert_eq!(o.output_dir, PathBuf::from(&out));
        assert_eq!(o.log_level, LogLevel::Info);
        assert_eq!(
            ok(&["analyze", "-i", &a, "--log-level=error"]).log_level,
            LogLevel::Error
        );
        assert!(
            ok(&["analyze", &format!("--input={a}")])
                .warnings
                .iter()
                .any(|w| w.contains("'--input' is deprecated"))
        );
        // Only as the first argument: elsewhere it is a program name.
        match ok(&["--level=op", "analyze"]).mode {
            Mode::Launch { program, .. } => assert_eq!(program, "analyze"),
            m => panic!("{m:?}"),
        }
        match ok(&["--", "analyze", "-i", &a]).mode {
            Mode::Launch { program, args } => {
                assert_eq!(program, "analyze");
                assert_eq!(args.len(), 2);
            }
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn analyze_sites_options() {
        use crate::report::{At, SitesRequest};
        let t = TempDir::new();
        let a = t.file("a.csv", b"x");
        let o = ok(&["analyze", "-i", &a, "--by-site", "--at=peak", "--timeline"]);
        assert_eq!(
            o.sites,
            SitesRequest {
                by_site: true,
                by_stack: false,
                at: Some(At::Peak),
                timeline_ms: Some(100),
            }
        );
        let o = ok(&[
            "analyze",
            "-i",
            &a,
            "--by-stack",
            "--at",
            "1.5",
            "--timeline=250",
        ]);
        assert!(o.sites.by_stack);
        assert_eq!(o.sites.at, Some(At::After(1_500_000_000)));
        assert_eq!(o.sites.timeline_ms, Some(250));
        assert_eq!(
            ok(&["analyze", "-i", &a, "--at=exit"]).sites.at,
            Some(At::Exit)
        );
        assert_eq!(ok(&["analyze", "-i", &a]).sites, SitesRequest::default());
        usage_err(
            &["analyze", "-i", &a, "--at=soon"],
            &["--at", "exit, peak or seconds"],
        );
        usage_err(&["analyze", "-i", &a, "--at=-1"], &["--at"]);
        usage_err(&["analyze", "-i", &a, "--timeline=0"], &["milliseconds"]);
        usage_err(&["analyze", "-i", &a, "--by-site=yes"], &["takes no value"]);
        // Outside analyze they say where they belong.
        usage_err(&["--by-site", "--", "true"], &["belongs to 'analyze'"]);
        usage_err(&["--perfetto", "--", "true"], &["belongs to 'report'"]);
    }

    #[test]
    fn report_mode() {
        use crate::report::{Formats, ReportRequest};
        let t = TempDir::new();
        let a = t.file("a.csv", b"x");
        let dir = t.path("");
        let out = t.path("r.html");
        match ok(&["report", "-i", &dir, "-o", &out]).mode {
            Mode::Report { request } => assert_eq!(
                request,
                ReportRequest {
                    inputs: vec![PathBuf::from(&dir)],
                    output: PathBuf::from(&out),
                    formats: Formats {
                        html: true,
                        ..Default::default()
                    },
                }
            ),
            m => panic!("{m:?}"),
        }
        match ok(&[
            "report",
            &format!("--input-path={dir},{a}"),
            "--perfetto",
            "-q",
        ])
        .mode
        {
            Mode::Report { request } => {
                assert_eq!(request.inputs.len(), 2);
                assert!(request.formats.html && request.formats.perfetto);
                assert!(request.output.ends_with("memscope_report.html"));
            }
            m => panic!("{m:?}"),
        }
        match ok(&["report", "-i", &a, "--format=folded,speedscope"]).mode {
            Mode::Report { request } => assert_eq!(
                request.formats,
                Formats {
                    html: false,
                    perfetto: false,
                    folded: true,
                    speedscope: true
                }
            ),
            m => panic!("{m:?}"),
        }
        usage_err(&["report"], &["report needs the run", "--input-path"]);
        usage_err(
            &["report", "-i", &a, "--format=png"],
            &["html, perfetto, folded or speedscope"],
        );
        usage_err(
            &["report", "-i", &format!("{a},{a},{a}")],
            &["one run, or two", "got 3"],
        );
        usage_err(&["report", "-i", &t.path("missing")], &["cannot read"]);
        usage_err(&["report", "-i", &a, "-o", &dir], &["is a directory"]);
        usage_err(
            &["report", "-i", &a, "--pid=1"],
            &["cannot be used with 'report'"],
        );
        usage_err(
            &["report", "-i", &a, "prog"],
            &["unexpected argument 'prog'"],
        );
        usage_err(
            &["report", "-i", &format!("{a},{a}"), "--format=perfetto"],
            &["add html"],
        );
        // --report at the end of a run.
        assert_eq!(ok(&["--report", "--", "true"]).report_at_end, Some(None));
        assert_eq!(
            ok(&[&format!("--report={out}"), "--", "true"]).report_at_end,
            Some(Some(PathBuf::from(&out)))
        );
        assert_eq!(ok(&["--", "true"]).report_at_end, None);
        assert!(help_text().contains("report --input-path"));
    }

    #[test]
    fn analyze_errors() {
        let t = TempDir::new();
        let a = t.file("a.csv", b"x");
        let b = t.file("b.csv", b"y");
        usage_err(&["analyze"], &["analyze needs", "--input-path"]);
        usage_err(
            &["analyze", "-i", &format!("{a},{b}")],
            &["exactly one", "got 2"],
        );
        usage_err(&["analyze", "-i", ""], &["exactly one", "got 0"]);
        usage_err(&["analyze", "-i"], &["requires a value"]);
        usage_err(&["analyze", &a], &["unexpected argument", "-- analyze"]);
        usage_err(
            &["analyze", "-i", &a, "--", "true"],
            &["unexpected argument"],
        );
        usage_err(
            &["analyze", "-i", &a, "--compare"],
            &["--compare", "analyze"],
        );
        usage_err(&["analyze", "-i", &a, "--pid=1"], &["--pid", "analyze"]);
        usage_err(&["analyze", "-i", &a, "--events=alloc"], &["--events"]);
        usage_err(&["analyze", "-i", &a, "--format=db"], &["--format"]);
        let missing = t.path("missing.csv");
        usage_err(
            &["analyze", "-i", &missing],
            &["missing.csv", "cannot be read"],
        );
        usage_err(
            &["analyze", "-i", &t.0.display().to_string()],
            &["not a regular file"],
        );
        let link = t.path("link.csv");
        std::os::unix::fs::symlink(&a, &link).unwrap();
        usage_err(&["analyze", "-i", &link], &["symbolic link"]);
        let big = t.path("big.csv");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_COMPARE_INPUT_BYTES + 1)
            .unwrap();
        usage_err(&["analyze", "-i", &big], &["8 GiB"]);
        usage_err(&["analyze", "-i", &"x".repeat(5000)], &["4096"]);
        // Help still works.
        assert!(err(&["analyze", "--help"]).is_info());
        assert!(help_text().contains("analyze --input-path"));
    }

    #[test]
    fn compare_rejects_files_over_8_gib() {
        let t = TempDir::new();
        let a = t.file("a.csv", b"x");
        let big = t.path("big.csv");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_COMPARE_INPUT_BYTES + 1).unwrap(); // sparse
        usage_err(&["--compare", "-i", &format!("{a},{big}")], &["8 GiB"]);
        f.set_len(MAX_COMPARE_INPUT_BYTES).unwrap();
        ok(&["--compare", "-i", &format!("{a},{big}")]);
    }

    // ----- help / version / unknown ------------------------------------------------------

    #[test]
    fn help_and_version_exit_zero() {
        for h in ["-h", "--help"] {
            let e = err(&[h]);
            assert_eq!(e.exit_code, 0);
            assert!(e.is_info());
            for needle in [
                "USAGE",
                "EXAMPLES",
                "memscope-bpf -- python train.py",
                "--output=./out bash run.sh",
                "--pid 1234",
                "--lib /",
                "libascend_hal.so",
                "--compare",
                "CAP_BPF",
                "CAP_PERFMON",
                "memscopeDumpResults",
                "Ctrl-C",
                "TARGET SELECTION",
                "WHAT TO COLLECT",
                "ANALYSIS",
                "OUTPUT",
                "MISC",
                "never consumed",
            ] {
                assert!(e.message.contains(needle), "help lacks {needle:?}");
            }
        }
        for v in ["-V", "--version"] {
            let e = err(&[v]);
            assert_eq!(e.exit_code, 0);
            assert_eq!(
                e.message,
                format!("memscope-bpf {}", env!("CARGO_PKG_VERSION"))
            );
        }
    }

    #[test]
    fn help_stops_parsing_but_earlier_errors_win() {
        assert_eq!(err(&["-h", "--bogus"]).exit_code, 0);
        assert_eq!(err(&["--bogus", "-h"]).exit_code, 2);
        assert_eq!(err(&["-qh"]).exit_code, 0);
        // After the program, -h belongs to the program.
        assert!(parse(&["true", "-h"]).is_ok());
    }

    #[test]
    fn help_lines_fit_100_columns() {
        for line in help_text().lines() {
            assert!(line.chars().count() <= 100, "{line}");
        }
    }

    #[test]
    fn unknown_options() {
        usage_err(
            &["--bogus", "true"],
            &["unrecognized option '--bogus'", "--help"],
        );
        usage_err(&["--bogus=1", "true"], &["unrecognized option '--bogus'"]);
        usage_err(&["-x", "true"], &["unrecognized option '-x'"]);
        usage_err(&["-vx", "true"], &["'-x'"]);
        usage_err(&["--quiet=yes", "true"], &["--quiet", "takes no value"]);
        usage_err(&["--compare=1"], &["takes no value"]);
    }

    #[test]
    fn option_value_forms() {
        let t = TempDir::new();
        let d = t.path("out");
        for args in [
            vec!["-o".to_owned(), d.clone()],
            vec![format!("-o{d}")],
            vec!["--output-path".to_owned(), d.clone()],
            vec![format!("--output-path={d}")],
            vec!["--output".to_owned(), d.clone()],
            vec![format!("--output={d}")],
        ] {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            assert_eq!(launch(&refs).output_dir, PathBuf::from(&d), "{args:?}");
        }
        // A required value is taken from the next argument even if it starts with '-'.
        launch_err(&["--events", "-v"], &["--events", "-v"]);
        usage_err(&["--events"], &["requires a value"]);
        usage_err(&["-o"], &["'-o' requires a value"]);
    }

    #[test]
    fn short_option_clusters() {
        let o = launch(&["-vq"]);
        assert_eq!(o.log_level, LogLevel::Debug);
        let t = TempDir::new();
        let d = t.path("o2");
        let o = launch(&[&format!("-qo{d}")]);
        assert_eq!(o.output_dir, PathBuf::from(&d));
        assert_eq!(o.log_level, LogLevel::Error);
    }

    #[test]
    fn last_occurrence_wins() {
        let o = launch(&[
            "--level=kernel",
            "--level=op",
            "--format=db",
            "--format=csv",
        ]);
        assert_eq!(
            o.levels,
            Levels {
                op: true,
                kernel: false
            }
        );
        assert_eq!(o.format, DataFormat::Csv);
    }

    // ----- output path ---------------------------------------------------------------------

    #[test]
    fn output_path_made_absolute_lexically() {
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(launch(&["-o", "out"]).output_dir, cwd.join("out"));
        assert_eq!(launch(&["-o", "./a/./b/../c"]).output_dir, cwd.join("a/c"));
        assert_eq!(
            launch(&["-o", "/tmp/x/../y/."]).output_dir,
            PathBuf::from("/tmp/y")
        );
        assert_eq!(launch(&["-o", "/../.."]).output_dir, PathBuf::from("/"));
        assert_eq!(
            launch(&["-o", "/tmp/结果 dir~_-.1"]).output_dir,
            PathBuf::from("/tmp/结果 dir~_-.1")
        );
    }

    #[test]
    fn output_path_errors() {
        launch_err(&["-o", ""], &["-o", "must not be empty"]);
        launch_err(
            &["--output-path=  "],
            &["--output-path", "must not be empty"],
        );
        for c in ["=x", "+x", "-x", "@x"] {
            launch_err(&["-o", c], &["invalid output path", "must not start with"]);
        }
        launch_err(&["-o", "/tmp/a$b"], &["invalid output path", "'$'"]);
        launch_err(&["-o", "/tmp/a:b"], &["':'"]);
        launch_err(&["-o", "/tmp/é"], &["'é'"]);
        launch_err(&["-o", &format!("/tmp/{}", "a".repeat(256))], &["255"]);
        launch_err(&["-o", &format!("/{}", "a".repeat(4097))], &["4096"]);
        let deep = "/a".repeat(33);
        launch_err(&["-o", &deep], &["33 '/'", "32"]);
        ok(&["-o", &"/a".repeat(32), "true"]);
        let t = TempDir::new();
        let f = t.file("plain", b"");
        launch_err(&["-o", &f], &["not a directory"]);
        // Deprecated alias gets a warning.
        let d = t.path("dep");
        let o = launch(&["--output", &d]);
        assert!(
            o.warnings
                .iter()
                .any(|w| w.contains("'--output' is deprecated") && w.contains("--output-path"))
        );
    }

    #[test]
    fn check_output_dir_rules() {
        assert!(check_output_dir(Path::new("/tmp/ok")).is_ok());
        assert!(check_output_dir(Path::new("/tmp/a\tb")).is_ok());
        assert!(check_output_dir(Path::new("/tmp/\u{4e00}\u{9fa5}")).is_ok());
        assert!(check_output_dir(Path::new("/tmp/\u{9fa6}")).is_err());
    }

    #[test]
    fn lexical_absolute_cases() {
        let cwd = Path::new("/home/u/w");
        assert_eq!(
            lexical_absolute(Path::new("."), cwd),
            PathBuf::from("/home/u/w")
        );
        assert_eq!(
            lexical_absolute(Path::new(".."), cwd),
            PathBuf::from("/home/u")
        );
        assert_eq!(
            lexical_absolute(Path::new("../../../../x"), cwd),
            PathBuf::from("/x")
        );
        assert_eq!(
            lexical_absolute(Path::new("a//b/"), cwd),
            PathBuf::from("/home/u/w/a/b")
        );
    }

    // ----- events / implied rules ----------------------------------------------------------

    #[test]
    fn events_parsing() {
        let o = launch(&["--events=launch"]);
        assert_eq!(
            o.dump_events,
            EventSet {
                launch: true,
                ..EventSet::NONE
            }
        );
        // default analysis (leaks) implies alloc+free collection
        assert_eq!(
            o.events,
            EventSet {
                alloc: true,
                free: true,
                launch: true,
                access: false
            }
        );
        let o = launch(&["--events=alloc,free,launch,access"]);
        assert_eq!(o.dump_events.bits(), 0b1111);
        let o = launch(&["--events", "alloc\u{ff0c}launch,,"]);
        assert_eq!(
            o.dump_events,
            EventSet {
                alloc: true,
                launch: true,
                ..EventSet::NONE
            }
        );
    }

    #[test]
    fn events_implied_rules() {
        let o = launch(&["--analysis=none", "--events=alloc"]);
        assert_eq!(
            o.events,
            EventSet {
                alloc: true,
                free: true,
                ..EventSet::NONE
            }
        );
        assert_eq!(
            o.dump_events,
            EventSet {
                alloc: true,
                ..EventSet::NONE
            }
        );
        let o = launch(&["--analysis=none", "--events=free"]);
        assert_eq!(
            o.events,
            EventSet {
                alloc: true,
                free: true,
                ..EventSet::NONE
            }
        );
        let o = launch(&["--analysis=none", "--events=access"]);
        assert_eq!(
            o.events,
            EventSet {
                alloc: true,
                free: true,
                access: true,
                launch: false
            }
        );
        let o = launch(&["--analysis=none", "--events=launch"]);
        assert_eq!(
            o.events,
            EventSet {
                launch: true,
                ..EventSet::NONE
            }
        );
    }

    #[test]
    fn analysis_implied_rules() {
        let o = launch(&["--events=none", "--analysis=oom"]);
        assert_eq!(o.dump_events, EventSet::NONE);
        assert_eq!(
            o.events,
            EventSet {
                alloc: true,
                free: true,
                ..EventSet::NONE
            }
        );
        let o = launch(&["--events=none", "--analysis=leaks"]);
        assert_eq!(
            o.events,
            EventSet {
                alloc: true,
                free: true,
                ..EventSet::NONE
            }
        );
        let o = launch(&["--events=none", "--analysis=decompose"]);
        assert_eq!(
            o.events,
            EventSet {
                alloc: true,
                free: true,
                access: true,
                launch: false
            }
        );
        let o = launch(&["--events=none", "--analysis=inefficient"]);
        assert_eq!(o.events.bits(), 0b1111);
        assert_eq!(o.dump_events, EventSet::NONE);
        let o = launch(&["--events=none", "--analysis=none"]);
        assert_eq!(o.events, EventSet::NONE);
    }

    #[test]
    fn events_none_and_traceback() {
        let o = launch(&["--events=none"]);
        assert_eq!(o.dump_events, EventSet::NONE);
        assert!(o.warnings.is_empty());
        let o = launch(&["--events=alloc,none"]);
        assert_eq!(o.dump_events, EventSet::NONE);
        assert!(o.warnings.iter().any(|w| w.contains("'none' mixed")));
        let o = launch(&["--events=alloc,traceback"]);
        assert_eq!(
            o.dump_events,
            EventSet {
                alloc: true,
                ..EventSet::NONE
            }
        );
        assert!(o.warnings.iter().any(|w| w.contains("traceback")));
    }

    #[test]
    fn events_errors() {
        launch_err(
            &["--events=alloc,bogus"],
            &["invalid event trace type", "--events", "'bogus'"],
        );
        launch_err(&["--events="], &["--events", "none"]);
        launch_err(&["--events=,,"], &["--events"]);
        launch_err(&["--events=ALLOC"], &["'ALLOC'"]);
    }

    // ----- level -------------------------------------------------------------------------

    #[test]
    fn levels_and_deprecated_numbers() {
        assert_eq!(
            launch(&["--level=kernel"]).levels,
            Levels {
                op: false,
                kernel: true
            }
        );
        assert_eq!(
            launch(&["--level=op,kernel"]).levels,
            Levels {
                op: true,
                kernel: true
            }
        );
        let o = launch(&["--level=0"]);
        assert_eq!(
            o.levels,
            Levels {
                op: true,
                kernel: false
            }
        );
        assert!(
            o.warnings
                .iter()
                .any(|w| w.contains("'--level=0' is deprecated") && w.contains("'--level=op'"))
        );
        let o = launch(&["--level=0,1"]);
        assert_eq!(
            o.levels,
            Levels {
                op: true,
                kernel: true
            }
        );
        assert!(
            o.warnings
                .iter()
                .any(|w| w.contains("'--level=1' is deprecated") && w.contains("'--level=kernel'"))
        );
        assert_eq!(o.levels.bits(), 3);
    }

    #[test]
    fn level_errors() {
        launch_err(
            &["--level=2"],
            &["invalid --level value '2'", "data trace level"],
        );
        launch_err(&["--level=op,bogus"], &["'bogus'"]);
        launch_err(&["--level="], &["--level"]);
    }

    // ----- steps -------------------------------------------------------------------------

    #[test]
    fn steps_parsing_and_leaks_disabled() {
        let o = launch(&["--steps=1,2\u{ff0c}3"]);
        assert_eq!(o.steps, vec![1, 2, 3]);
        assert!(!o.analysis.leaks);
        assert!(o.warnings.is_empty(), "implicit leaks need no warning");
        let o = launch(&["--steps=4294967295,1,2,3,5"]);
        assert_eq!(o.steps, vec![u32::MAX, 1, 2, 3, 5]);
        let o = launch(&["--analysis=leaks,decompose", "--steps=2"]);
        assert!(!o.analysis.leaks && o.analysis.decompose);
        assert!(o.warnings.iter().any(|w| w.contains("--steps")));
        assert_eq!(o.analysis.bits(), 0b10);
    }

    #[test]
    fn steps_errors() {
        launch_err(&["--steps=1,2,3,4,5,6"], &["--steps", "at most 5"]);
        for bad in ["0", "01", "-1", "+1", "1.0", "x", "4294967296"] {
            launch_err(
                &[&format!("--steps={bad}")],
                &["invalid --steps value", "invalid steps"],
            );
        }
        launch_err(&["--steps="], &["--steps"]);
    }

    // ----- call stack ----------------------------------------------------------------------

    #[test]
    fn call_stack_parsing() {
        assert_eq!(
            launch(&["--call-stack=c"]).call_stack,
            CallStack {
                c_depth: Some(50),
                python_depth: None,
                mixed: false
            }
        );
        assert_eq!(
            launch(&["--call-stack=c:20,python:10"]).call_stack,
            CallStack {
                c_depth: Some(20),
                python_depth: Some(10),
                mixed: false
            }
        );
        assert_eq!(
            launch(&["--call-stack=python:1000\u{ff0c}c:0"]).call_stack,
            CallStack {
                c_depth: Some(0),
                python_depth: Some(1000),
                mixed: false
            }
        );
        assert_eq!(
            launch(&["--call-stack=python:10,mixed:30"]).call_stack,
            CallStack {
                c_depth: Some(30),
                python_depth: Some(10),
                mixed: true
            }
        );
        assert_eq!(
            launch(&["--call-stack=c", "--call-stack="]).call_stack,
            CallStack::default()
        );
    }

    #[test]
    fn call_stack_errors() {
        for bad in [
            "c:1001", "c:01", "c:", "c:-1", "python:x", "java", "c:5:6", "C",
        ] {
            launch_err(&[&format!("--call-stack={bad}")], &["--call-stack", bad]);
        }
        launch_err(&["--call-stack=c:1001"], &["call-stack depth"]);
    }

    // ----- collect mode / format / log level -----------------------------------------------

    #[test]
    fn collect_mode() {
        assert_eq!(
            launch(&["--collect-mode=deferred"]).collect_mode,
            CollectMode::Deferred
        );
        assert_eq!(
            launch(&["--collect-mode", "immediate"]).collect_mode,
            CollectMode::Immediate
        );
        launch_err(
            &["--collect-mode=lazy"],
            &["--collect-mode", "'lazy'", "immediate or deferred"],
        );
    }

    #[test]
    fn format_and_deprecated_alias() {
        assert_eq!(launch(&["--format=db"]).format, DataFormat::Db);
        let o = launch(&["--data-format=db"]);
        assert_eq!(o.format, DataFormat::Db);
        assert!(
            o.warnings
                .iter()
                .any(|w| w.contains("'--data-format' is deprecated") && w.contains("'--format'"))
        );
        launch_err(&["--format=json"], &["--format", "'json'", "csv or db"]);
        launch_err(&["--data-format=json"], &["--data-format", "'json'"]);
    }

    #[test]
    fn log_level_and_precedence() {
        assert_eq!(launch(&["--log-level=debug"]).log_level, LogLevel::Debug);
        assert_eq!(launch(&["--log-level=error"]).log_level, LogLevel::Error);
        assert_eq!(
            launch(&["--log-level=warning"]).log_level,
            LogLevel::Warning
        );
        let o = launch(&["--log-level=warn"]);
        assert_eq!(o.log_level, LogLevel::Warning);
        assert!(
            o.warnings
                .iter()
                .any(|w| w.contains("'--log-level=warn' is deprecated"))
        );
        for v in ["-v", "--verbose", "--debug"] {
            assert_eq!(launch(&[v]).log_level, LogLevel::Debug);
        }
        for q in ["-q", "--quiet"] {
            assert_eq!(launch(&[q]).log_level, LogLevel::Error);
        }
        assert_eq!(launch(&["-q", "-v"]).log_level, LogLevel::Debug);
        assert_eq!(
            launch(&["-v", "--log-level=info"]).log_level,
            LogLevel::Info
        );
        assert_eq!(
            launch(&["--log-level=info", "-q"]).log_level,
            LogLevel::Info
        );
        launch_err(
            &["--log-level=trace"],
            &["--log-level", "'trace'", "debug, info, warning or error"],
        );
    }

    // ----- device --------------------------------------------------------------------------

    #[test]
    fn device_parsing() {
        let d = launch(&["--device=npu:0,npu:3"]).devices;
        assert_eq!(
            d,
            DeviceFilter {
                all_npu: false,
                npu_mask: 0b1001,
                cpu: false
            }
        );
        assert!(d.wants_npu(0) && d.wants_npu(3) && !d.wants_npu(1) && !d.wants_npu(31));
        assert!(!d.wants_npu(32) && !d.wants_npu(u32::MAX));
        assert!(d.wants_npu(UNKNOWN_DEVICE_ID));
        assert!(!d.wants_cpu());
        let d = launch(&["--device=cpu"]).devices;
        assert!(d.wants_cpu() && !d.wants_npu(0));
        let d = launch(&["--device=npu:1,npu"]).devices;
        assert!(d.all_npu && d.wants_npu(5) && d.npu_mask == 0b10);
        let d = launch(&["--device=npu:0x1f\u{ff0c}npu:010,npu:31"]).devices;
        assert_eq!(
            d.npu_mask,
            (1 << 31) | (1 << 8) | (1 << 31) | (1 << 31) | (1 << 8) | (1 << 31)
        );
        let d = launch(&["--device=npu:0x1f,npu:010"]).devices;
        assert_eq!(d.npu_mask, (1 << 31) | (1 << 8));
        let d = DeviceFilter::default();
        assert!(d.wants_npu(0) && d.wants_npu(12345) && !d.wants_cpu());
    }

    #[test]
    fn device_errors() {
        launch_err(
            &["--device=gpu"],
            &["invalid --device value 'gpu': expected npu, cpu or npu:N with N < 32"],
        );
        for bad in [
            "npu:32", "npu:", "npu:x", "npu:-1", "npu:0x", "npu:08", "npu:1a", "NPU",
        ] {
            launch_err(
                &[&format!("--device={bad}")],
                &["invalid --device value", bad],
            );
        }
        launch_err(&["--device="], &["--device", "at least one"]);
        launch_err(&["--device=,"], &["--device"]);
    }

    // ----- analysis ------------------------------------------------------------------------

    #[test]
    fn analysis_parsing() {
        let a = launch(&["--analysis=decompose,inefficient"]).analysis;
        assert_eq!(
            a,
            AnalysisSet {
                decompose: true,
                inefficient: true,
                ..AnalysisSet::default()
            }
        );
        let a = launch(&["--analysis=oom"]).analysis;
        assert_eq!(a.oom_top_k, Some(10));
        assert!(!a.leaks);
        assert_eq!(launch(&["--analysis=oom:1"]).analysis.oom_top_k, Some(1));
        assert_eq!(
            launch(&["--analysis=leaks\u{ff0c}oom:1000"])
                .analysis
                .bits(),
            0b1001
        );
        let o = launch(&["--analysis=none"]);
        assert!(o.analysis.is_empty() && o.warnings.is_empty());
        let o = launch(&["--analysis=leaks,none"]);
        assert!(o.analysis.is_empty());
        assert!(o.warnings.iter().any(|w| w.contains("'none' mixed")));
    }

    #[test]
    fn analysis_errors() {
        launch_err(
            &["--analysis=bogus"],
            &["invalid --analysis value 'bogus'", "invalid analysis type"],
        );
        for bad in ["oom:0", "oom:1001", "oom:", "oom:01", "oom:x"] {
            launch_err(
                &[&format!("--analysis={bad}")],
                &["invalid OOM top-K", "1 to 1000"],
            );
        }
        launch_err(&["--analysis=oomx"], &["'oomx'"]);
        launch_err(&["--analysis="], &["--analysis", "none"]);
    }

    // ----- watch ---------------------------------------------------------------------------

    #[test]
    fn watch_parsing() {
        let o = launch(&["--watch=opA:2,opB,full-content"]);
        assert_eq!(o.watch.as_deref(), Some("opA:2,opB,full-content"));
        assert_eq!(
            o.watch_config(),
            Some(WatchConfig {
                start: Some("opA".into()),
                output_id: Some(2),
                end: "opB".into(),
                full_content: true
            })
        );
        assert_eq!(
            parse_watch(",end").unwrap(),
            WatchConfig {
                start: None,
                output_id: None,
                end: "end".into(),
                full_content: false
            }
        );
        assert_eq!(parse_watch("s,e").unwrap().start.as_deref(), Some("s"));
        assert_eq!(parse_watch("s:0,e").unwrap().output_id, Some(0));
        assert_eq!(
            parse_watch("s:4294967295,e").unwrap().output_id,
            Some(u32::MAX)
        );
        assert!(parse_watch(&format!("{},e", "a".repeat(254))).is_ok());
    }

    #[test]
    fn watch_errors() {
        for bad in [
            "end",
            "s,",
            ",",
            "",
            ":1,e",
            "s:,e",
            "s:01,e",
            "s:x,e",
            "s:4294967296,e",
            "s,e,full",
            "s,e,full-content,x",
            "s,e,",
        ] {
            launch_err(
                &[&format!("--watch={bad}")],
                &["invalid --watch value", "invalid watch config"],
            );
        }
        launch_err(&[&format!("--watch={},e", "a".repeat(255))], &["254"]);
        launch_err(&[&format!("--watch=s,{}", "a".repeat(255))], &["254"]);
    }

    // ----- lib / ring buffer -----------------------------------------------------------------

    #[test]
    fn libs() {
        let t = TempDir::new();
        // The first 18 bytes of an x86-64 shared object: ELF64, little-endian, ET_DYN.
        let so = b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0\x03\0";
        let a = t.file("liba.so", so);
        let b = t.file("libb.so", so);
        let link = t.path("liblink.so");
        std::os::unix::fs::symlink(&b, &link).unwrap();
        let dotted = format!("{}/./liba.so", t.0.display());
        let o = launch(&["--lib", &dotted, &format!("--lib={link}")]);
        assert_eq!(
            o.libs,
            vec![
                std::fs::canonicalize(&a).unwrap(),
                std::fs::canonicalize(&b).unwrap()
            ]
        );
    }

    #[test]
    fn lib_errors() {
        let t = TempDir::new();
        launch_err(&["--lib", &t.path("nope.so")], &["--lib", "nope.so"]);
        launch_err(
            &["--lib", t.0.to_str().unwrap()],
            &["--lib", "not a regular file"],
        );
        launch_err(&["--lib="], &["--lib", "empty"]);
        let dangling = t.path("dangling.so");
        std::os::unix::fs::symlink(t.path("missing"), &dangling).unwrap();
        launch_err(&["--lib", &dangling], &["dangling.so"]);
    }

    #[test]
    fn ring_buffer() {
        for (v, n) in [("1", 1), ("2", 2), ("64", 64), ("1024", 1024)] {
            assert_eq!(
                launch(&[&format!("--ring-buffer-mib={v}")]).ring_buffer_mib,
                n
            );
        }
        for bad in ["0", "3", "2048", "-1", "+16", "016", "x", "", "1.0"] {
            launch_err(
                &["--ring-buffer-mib", bad],
                &["--ring-buffer-mib", "power of two"],
            );
        }
    }

    // ----- list splitting -----------------------------------------------------------------

    #[test]
    fn list_splitting_is_character_based() {
        assert_eq!(split_list("a,b\u{ff0c}c,,\u{ff0c}"), vec!["a", "b", "c"]);
        // U+EF3C ("\u{ef3c}") contains byte 0xEF but must not split.
        assert_eq!(split_list("a\u{ef3c}b"), vec!["a\u{ef3c}b"]);
        assert_eq!(split_list(""), Vec::<&str>::new());
        let raw = OsString::from_vec(b"a\xff,b\xef\xbc\x8cc\xef\xbc".to_vec());
        let parts: Vec<_> = split_list_os(&raw)
            .into_iter()
            .map(|p| p.as_bytes().to_vec())
            .collect();
        assert_eq!(
            parts,
            vec![b"a\xff".to_vec(), b"b".to_vec(), b"c\xef\xbc".to_vec()]
        );
    }

    #[test]
    fn number_helpers() {
        assert_eq!(parse_decimal("0", true), Some(0));
        assert_eq!(parse_decimal("0", false), None);
        assert_eq!(parse_decimal("00", true), None);
        assert_eq!(parse_decimal("4294967295", false), Some(u32::MAX));
        assert_eq!(parse_decimal("4294967296", false), None);
        assert_eq!(parse_c_number("0x1F"), Some(31));
        assert_eq!(parse_c_number("017"), Some(15));
        assert_eq!(parse_c_number("0"), Some(0));
        assert_eq!(parse_c_number("09"), None);
        assert_eq!(parse_c_number("0x"), None);
    }

    // ----- config.json --------------------------------------------------------------------

    #[test]
    fn config_json_defaults_exact() {
        let mut o = launch(&[]);
        o.output_dir = PathBuf::from("/tmp/out");
        let expected = r#"{
    "SelectedStepList": {
        "stepCount": 0,
        "stepIdList": [
            0,
            0,
            0,
            0,
            0
        ]
    },
    "analysisType": 1,
    "cStackDepth": 0,
    "collectAllNpu": true,
    "collectCpu": false,
    "collectMode": 0,
    "dataFormat": 0,
    "dumpEventType": 7,
    "enableCStack": false,
    "enableCompare": false,
    "enablePyStack": false,
    "eventType": 7,
    "isEffective": true,
    "levelType": 1,
    "logLevel": 1,
    "npuSlots": 0,
    "oomTopK": 10,
    "outputDir": "/tmp/out",
    "pyStackDepth": 0,
    "watchConfig": {
        "end": "",
        "fullContent": false,
        "isWatched": false,
        "outputId": 4294967295,
        "start": ""
    }
}"#;
        assert_eq!(config_json(&o), expected);
    }

    #[test]
    fn config_json_values() {
        let mut o = launch(&[
            "--steps=3,7",
            "--events=access",
            "--analysis=oom:5,decompose",
            "--level=kernel",
            "--device=npu:2,cpu",
            "--call-stack=c:20,python",
            "--collect-mode=deferred",
            "--format=db",
            "--log-level=error",
            "--watch=mm:1,add,full-content",
        ]);
        o.output_dir = PathBuf::from("/tmp/a \"q\"\\\t");
        let j = config_json(&o);
        for needle in [
            "\"stepCount\": 2",
            "            3,\n            7,\n            0,",
            "\"analysisType\": 10",
            "\"oomTopK\": 5",
            "\"eventType\": 11",
            "\"dumpEventType\": 8",
            "\"levelType\": 2",
            "\"collectAllNpu\": false",
            "\"collectCpu\": true",
            "\"npuSlots\": 4",
            "\"enableCStack\": true",
            "\"cStackDepth\": 20",
            "\"enablePyStack\": true",
            "\"pyStackDepth\": 50",
            "\"collectMode\": 1",
            "\"dataFormat\": 1",
            "\"logLevel\": 3",
            "\"isWatched\": true",
            "\"fullContent\": true",
            "\"start\": \"mm\"",
            "\"end\": \"add\"",
            "\"outputId\": 1",
            "\"outputDir\": \"/tmp/a \\\"q\\\"\\\\\\t\"",
        ] {
            assert!(j.contains(needle), "{needle:?} not in\n{j}");
        }
    }

    #[test]
    fn json_escape_controls() {
        let mut s = String::new();
        json_escape("a\u{1}\u{8}\u{c}\n\r\u{7f}结", &mut s);
        assert_eq!(s, "\"a\\u0001\\b\\f\\n\\r\u{7f}结\"");
    }

    #[test]
    fn error_display_and_trait() {
        let e = CliError::usage("boom");
        assert_eq!(e.to_string(), "boom");
        let _: &dyn std::error::Error = &e;
        assert!(!e.is_info());
    }

    #[test]
    fn control_chars_in_values_are_escaped_in_messages() {
        let e = err(&["--format=a\nb", "true"]);
        assert!(e.message.contains("a\\nb"), "{e}");
        assert!(!e.message.contains('\n'));
    }
}
