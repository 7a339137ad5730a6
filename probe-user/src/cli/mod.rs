//! Command-line parsing and validation for `memscope-bpf`, with clap (derive).
//!
//! The option set, defaults, validation rules and deprecated aliases follow msMemScope's
//! `msmemscope` client (see the spec, section 4), with one deliberate deviation: everything from
//! the first non-option argument on belongs to the traced program. msMemScope used GNU getopt
//! permutation and so also consumed options written after the program name; we never do.
//!
//! `args.rs` declares every option (spelling, aliases, help); `values.rs` holds the typed value
//! parsers for what clap cannot check (msMemScope's lists split on `,` and `，`, ranges, paths);
//! this file turns clap's result into [`Options`] and checks what spans several options;
//! `config.rs` writes `config.json`. Program arguments pass through untouched, even when not
//! UTF-8. `--help` and `--version` come back as `Err(CliError { exit_code: 0, .. })` so that
//! the caller prints the message on stdout and exits 0; every usage error has `exit_code` 2.
//! Uses only `crate::report`'s request types.

// The public API is wider than what any one caller uses (bitfield helpers, constants, ...).
#![allow(dead_code)]

mod args;
mod config;
#[cfg(test)]
mod tests;
mod values;

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{CommandFactory, FromArgMatches};

use args::{Cli, Sub};
pub use config::config_json;
use values::{List, Warned, shown, shown_os};
pub use values::{lexical_absolute, parse_watch, split_list};
#[cfg(test)]
use {
    config::json_escape,
    values::{check_output_dir, parse_c_number, parse_decimal, split_list_os},
};

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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
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

/// `memscope-bpf <version>`.
pub fn version_text() -> String {
    format!("{PROGRAM_NAME} {}", env!("CARGO_PKG_VERSION"))
}

/// The `--help` text.
pub fn help_text() -> String {
    command().render_help().to_string()
}

/// The clap command, with option values allowed to start with '-': a required value is taken
/// from the next argument whatever it looks like, as getopt does (`--events -v` is an error
/// about "-v", not a missing value). The program's positional keeps clap's default, so that an
/// unknown option is an error instead of a program name.
fn command() -> clap::Command {
    Cli::command()
        .mut_args(hyphen_values)
        .mut_subcommands(|s| s.mut_args(hyphen_values))
}

pub(crate) fn hyphen_values(a: clap::Arg) -> clap::Arg {
    let option = a.get_long().is_some() || a.get_short().is_some();
    let takes_value = matches!(
        a.get_action(),
        clap::ArgAction::Set | clap::ArgAction::Append
    );
    a.allow_hyphen_values(option && takes_value)
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
    let matches = command()
        .try_get_matches_from(&argv)
        .map_err(|e| from_clap(e, &argv))?;
    let cli = Cli::from_arg_matches(&matches).map_err(|e| from_clap(e, &argv))?;
    match cli.command {
        Some(Sub::Analyze(a)) => {
            let mut warnings = Vec::new();
            let input =
                alias(a.input_path, a.input, "--input-path", &mut warnings).ok_or_else(|| {
                    CliError::usage("analyze needs the dump to read: analyze --input-path=DUMP")
                })?;
            let sites = crate::report::SitesRequest {
                by_site: a.by_site,
                by_stack: a.by_stack,
                at: a.at,
                timeline_ms: a
                    .timeline
                    .map(|ms| ms.unwrap_or(crate::report::model::DEFAULT_TIMELINE_MS)),
            };
            let trace = args::TraceArgs {
                output_path: alias(a.output_path, a.output, "--output-path", &mut warnings),
                log: a.log,
                ..Default::default()
            };
            finish(Mode::Analyze { input }, trace, warnings, sites)
        }
        Some(Sub::Report(r)) => {
            let mut warnings = Vec::new();
            let Some(List(inputs)) = alias(r.input_path, r.input, "--input-path", &mut warnings)
            else {
                return Err(CliError::usage(
                    "report needs the run to draw: report --input-path=RUN_DIR|DUMP",
                ));
            };
            let mut formats = r.format.unwrap_or(crate::report::Formats {
                html: true,
                ..Default::default()
            });
            formats.perfetto |= r.perfetto;
            if inputs.len() == 2 && !formats.html {
                return Err(CliError::usage(
                    "two runs are compared in the HTML report: add html to --format",
                ));
            }
            let output = match alias(r.output_path, r.output, "--output-path", &mut warnings) {
                Some(p) => p,
                None => {
                    lexical_absolute(Path::new("memscope_report.html"), &values::current_dir()?)
                }
            };
            let request = crate::report::ReportRequest {
                inputs,
                output,
                formats,
            };
            let trace = args::TraceArgs {
                log: r.log,
                ..Default::default()
            };
            finish(
                Mode::Report { request },
                trace,
                warnings,
                Default::default(),
            )
        }
        None => {
            let mut t = cli.trace;
            let mut warnings = Vec::new();
            let inputs = alias(
                t.input_path.take(),
                t.input.take(),
                "--input-path",
                &mut warnings,
            );
            let mode = trace_mode(&mut t, inputs, &argv)?;
            finish(mode, t, warnings, Default::default())
        }
    }
}

/// The value of an option or of its deprecated spelling (clap keeps only the later one).
fn alias<T>(value: Option<T>, old: Option<T>, name: &str, warnings: &mut Vec<String>) -> Option<T> {
    if old.is_some() {
        let old_name = name.strip_suffix("-path").unwrap_or("--data-format");
        warnings.push(values::deprecated(old_name, name));
    }
    value.or(old)
}

/// Launch, attach or compare, from the program, `--pid`, `--compare` and `--input-path`.
fn trace_mode(
    t: &mut args::TraceArgs,
    inputs: Option<[PathBuf; 2]>,
    argv: &[OsString],
) -> Result<Mode, CliError> {
    let mut words = std::mem::take(&mut t.program).into_iter();
    let program = words.next();
    if program.is_none() && argv.iter().skip(1).any(|a| a == "--") {
        return Err(CliError::usage(format!(
            "'--' must be followed by the program to launch (see '{PROGRAM_NAME} --help')"
        )));
    }
    let only_with_compare = || CliError::usage("--input-path is only used together with --compare");
    match (program, t.pid, t.compare, inputs) {
        (Some(_), Some(_), _, _) => Err(CliError::usage(
            "--pid cannot be combined with a program to launch; use one or the other",
        )),
        (_, Some(_), true, _) => Err(CliError::usage(
            "--pid and --compare cannot be used together",
        )),
        (Some(program), None, true, _) => Err(CliError::usage(format!(
            "--compare runs no program, but '{}' was given",
            shown_os(&program)
        ))),
        (None, None, true, Some(inputs)) => Ok(Mode::Compare { inputs }),
        (None, None, true, None) => Err(CliError::usage(
            "--compare needs two dump files: --input-path=<A>,<B>",
        )),
        (_, _, false, Some(_)) => Err(only_with_compare()),
        (Some(program), None, false, None) => Ok(Mode::Launch {
            program,
            args: words.collect(),
        }),
        (None, Some(pid), false, None) => Ok(Mode::Attach { pid }),
        (None, None, false, None) => Err(CliError::usage(format!(
            "nothing to trace: give a program to launch, --pid PID or --compare \
             (see '{PROGRAM_NAME} --help')"
        ))),
    }
}

/// The checks that span several options, the implied events, and the final [`Options`].
fn finish(
    mode: Mode,
    t: args::TraceArgs,
    mut warnings: Vec<String>,
    sites: crate::report::SitesRequest,
) -> Result<Options, CliError> {
    if t.max_files.is_some() && t.max_file_mib.is_none() {
        return Err(CliError::usage(
            "--max-files needs --max-file-mib (files are only rotated by size)",
        ));
    }
    let format = alias(t.format, t.data_format, "--format", &mut warnings).unwrap_or_default();
    if t.max_file_mib.is_some() && format == DataFormat::Db {
        return Err(CliError::usage(
            "--max-file-mib rotates CSV dumps; it cannot be used with --format=db",
        ));
    }
    let output_dir = match alias(t.output_path, t.output, "--output-path", &mut warnings) {
        Some(d) => d,
        None => values::default_output_dir()?,
    };
    let log_level = t.log.level();
    let dump_events = unwarn(t.events, EventSet::CLI_DEFAULT, &mut warnings);
    let levels = unwarn(t.level, Levels::default(), &mut warnings);
    let analysis_explicit = t.analysis.is_some();
    let mut analysis = unwarn(t.analysis, AnalysisSet::CLI_DEFAULT, &mut warnings);
    unwarn(t.log.log_level, LogLevel::Info, &mut warnings);
    let steps = t.steps.map(|List(s)| s).unwrap_or_default();
    if !steps.is_empty() && analysis.leaks {
        analysis.leaks = false;
        if analysis_explicit {
            warnings.push("leak analysis is turned off because --steps is given".to_owned());
        }
    }
    Ok(Options {
        mode,
        output_dir,
        events: dump_events.with_implied().union(analysis.implied_events()),
        dump_events,
        levels,
        devices: t.device.unwrap_or_default(),
        analysis,
        steps,
        call_stack: t.call_stack.unwrap_or_default(),
        collect_mode: t.collect_mode.unwrap_or_default(),
        format,
        watch: t.watch,
        log_level,
        libs: t.lib,
        ring_buffer_mib: t.ring_buffer_mib.unwrap_or(DEFAULT_RING_BUFFER_MIB),
        as_root: t.as_root,
        max_file_mib: t.max_file_mib,
        max_files: t.max_files,
        warnings,
        sites,
        report_at_end: t.report,
    })
}

fn unwarn<T>(value: Option<Warned<T>>, default: T, warnings: &mut Vec<String>) -> T {
    match value {
        Some(Warned(v, w)) => {
            warnings.extend(w);
            v
        }
        None => default,
    }
}

/// A clap error in this program's words: one line, the option as the user can find it in
/// `--help`, and for options of another mode, where they belong. `argv[1]` names the mode.
pub(crate) fn from_clap(e: clap::Error, argv: &[OsString]) -> CliError {
    let text = |kind| match e.get(kind) {
        Some(ContextValue::String(s)) => s.clone(),
        _ => String::new(),
    };
    let mode = argv.get(1).and_then(|a| a.to_str()).unwrap_or_default();
    let mode = ["analyze", "report", "agent"]
        .into_iter()
        .find(|m| *m == mode);
    // clap names an option with its placeholder: "--events <LIST>".
    let invalid_arg = text(ContextKind::InvalidArg);
    let arg = invalid_arg.split(' ').next().unwrap_or_default();
    let value = text(ContextKind::InvalidValue);
    let last = argv.last().map(|a| a.to_string_lossy()).unwrap_or_default();
    let message = match e.kind() {
        ErrorKind::DisplayHelp => return CliError::info(e.to_string().trim_end()),
        ErrorKind::DisplayVersion => return CliError::info(version_text()),
        // Ours carry the whole message; clap's (plain fn parsers) the reason as the source.
        ErrorKind::ValueValidation => {
            match (text(ContextKind::Custom), std::error::Error::source(&e)) {
                (ours, _) if !ours.is_empty() => ours,
                (_, why) => {
                    let why = why.map(|w| w.to_string()).unwrap_or_default();
                    format!("invalid {arg} value '{}': {why}", shown(&value))
                }
            }
        }
        // A missing value: clap stopped at the last argument, the option itself.
        ErrorKind::InvalidValue if value.is_empty() && !last.contains('=') => {
            let name = match last.strip_prefix("--") {
                Some(_) => last.to_string(),
                None => format!("-{}", last.chars().last().unwrap_or('?')),
            };
            match mode {
                Some("agent") => format!("{name} needs a value"),
                _ => format!("option '{name}' requires a value (see '{PROGRAM_NAME} --help')"),
            }
        }
        ErrorKind::InvalidValue => {
            let valid = match e.get(ContextKind::ValidValue) {
                Some(ContextValue::Strings(v)) => v.clone(),
                _ => Vec::new(),
            };
            let expected = match valid.split_last() {
                Some((last, [])) => last.clone(),
                Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
                None => "a value".to_owned(),
            };
            format!(
                "invalid {arg} value '{}': expected {expected}",
                shown(&value)
            )
        }
        ErrorKind::TooManyValues => format!("option '{arg}' takes no value"),
        ErrorKind::UnknownArgument => unknown_argument(arg, mode, argv),
        _ => {
            let rendered = e.to_string();
            let first = rendered.lines().next().unwrap_or_default();
            first.strip_prefix("error: ").unwrap_or(first).to_owned()
        }
    };
    CliError::usage(message)
}

fn unknown_argument(arg: &str, mode: Option<&str>, argv: &[OsString]) -> String {
    if !arg.starts_with('-') {
        let why = match mode {
            Some("analyze") => format!(
                "'analyze' reads the dump given with --input-path=DUMP (to launch a program \
                 named analyze, write '{PROGRAM_NAME} -- analyze')"
            ),
            Some("report") => "'report' reads the run given with --input-path=RUN".to_owned(),
            _ => format!(
                "the agent takes no program or pid, it traces every process using the Ascend \
                 libraries (see '{PROGRAM_NAME} agent --help')"
            ),
        };
        return format!("unexpected argument '{}': {why}", shown(arg));
    }
    // clap shows bytes that are not UTF-8 as U+FFFD; show the user's own bytes instead.
    let raw = argv
        .iter()
        .skip(1)
        .find(|a| a.to_str().is_none() && a.as_bytes().starts_with(b"-"));
    let arg = match raw {
        Some(raw) if arg.contains('\u{fffd}') => {
            let bytes = raw.as_bytes();
            shown_os(OsStr::from_bytes(
                bytes.split(|&b| b == b'=').next().unwrap_or(bytes),
            ))
        }
        _ => shown(arg),
    };
    let traced = || {
        Cli::command().get_arguments().any(|a| {
            a.get_long().is_some_and(|l| arg == format!("--{l}"))
                || a.get_short().is_some_and(|s| arg == format!("-{s}"))
        })
    };
    match mode {
        Some("agent") => {
            format!("unknown agent option '{arg}' (see '{PROGRAM_NAME} agent --help')")
        }
        Some("analyze") if traced() => format!(
            "{arg} cannot be used with 'analyze' (it takes --input-path=DUMP, --output-path, \
             --by-site, --by-stack, --at, --timeline, --log-level, -v and -q)"
        ),
        Some("report") if traced() => format!(
            "{arg} cannot be used with 'report' (it takes --input-path=RUN[,RUN2], \
             --output-path=FILE, --format, --perfetto, --log-level, -v and -q)"
        ),
        None if args::ANALYZE_ONLY.contains(&arg.as_str()) => {
            format!("{arg} belongs to 'analyze': {PROGRAM_NAME} analyze -i DUMP {arg}")
        }
        None if args::REPORT_ONLY.contains(&arg.as_str()) => {
            format!("{arg} belongs to 'report': {PROGRAM_NAME} report -i RUN --perfetto")
        }
        _ => format!("unrecognized option '{arg}' (see '{PROGRAM_NAME} --help')"),
    }
}
