//! The command line as clap derive structs: each option's spelling, aliases, value parser and
//! help. Checks that involve several options (modes, implied events) are in `mod.rs`.

use std::{ffi::OsString, path::PathBuf};

use clap::{ArgAction, Args, Parser, Subcommand};

use super::values::{self as v, Check, List};
use super::{DEFAULT_RING_BUFFER_MIB, Mode};
use crate::report::{At, Formats};
use crate::settings::*;

const HELP: &str = "\
{name} {version} - trace the NPU memory of an unmodified process with eBPF uprobes,
writing msMemScope-compatible results (memscope_dump_<ts>.csv/.db, config.json, analyses).

USAGE:
    memscope-bpf [OPTIONS] -- <PROGRAM> [ARGS...]     launch PROGRAM and trace it
    memscope-bpf [OPTIONS] <PROGRAM> [ARGS...]        same, msMemScope style
    memscope-bpf --pid <PID> [OPTIONS]                attach to a running process
    memscope-bpf --compare --input-path <A>,<B>       compare two dump files
    memscope-bpf analyze --input-path <DUMP> [-o DIR] leak analysis of a saved dump
    memscope-bpf report --input-path <RUN> [-o DIR]   HTML report (and Perfetto trace) of a run
    memscope-bpf agent [OPTIONS]                      node agent for Prometheus and pprof

    -o/--output-path names a directory in every mode (created if missing).
    Everything from the first argument that is not an option belongs to PROGRAM:
    `memscope-bpf --level=op bash run.sh --level=kernel` passes --level=kernel to run.sh.
    (Unlike msMemScope, options written after the program name are never consumed.)
    Tracing needs root, or CAP_BPF + CAP_PERFMON. Press Ctrl-C to detach: everything
    collected so far is written out. List values are comma separated (',' or '，').
    'memscope-bpf analyze --help', 'report --help' and 'agent --help' list their options.

{all-args}{after-help}";

const EXAMPLES: &str = "\
EXAMPLES:
    # Trace a training script with the defaults (results in ./memscopeDumpResults)
    sudo memscope-bpf -- python train.py

    # msMemScope-style invocation with another output directory
    sudo memscope-bpf --output=./out bash run.sh

    # Attach to a running process; Ctrl-C detaches and writes the results
    sudo memscope-bpf --pid 1234

    # Point at the driver library explicitly
    sudo memscope-bpf --lib /usr/local/Ascend/driver/lib64/driver/libascend_hal.so \\
        -- python train.py

    # Kernel-level tracing with C and Python stacks
    sudo memscope-bpf --level=op,kernel --call-stack=c:20,python:10 -- python train.py

    # Operators, kernels (ATen and ATB), tensor accesses and the memory breakdown
    sudo memscope-bpf --level=op,kernel --events=alloc,free,launch,access \\
        --analysis=leaks,decompose,inefficient -- python train.py

    # Compare two runs
    memscope-bpf --compare --input-path=base/memscope_dump_1.csv,new/memscope_dump_2.csv

    # Leak analysis of a saved dump (ours or msMemScope's, CSV or db)
    memscope-bpf analyze --input=results/device_0/dump/memscope_dump_1.db -o ./analysis

    # Where the memory was at the peak, by source line, and the 100 ms maxima
    memscope-bpf analyze -i memscope_dump_1.csv --by-site --at=peak --timeline

    # The report of a run, and a Perfetto trace beside it (./reports/memscope_report.html,
    # ./reports/memscope_report.perfetto.json)
    memscope-bpf report -i ./memscopeDumpResults -o ./reports --perfetto";

/// The whole command line. `analyze` and `report` are subcommands only as the first argument
/// (`args_conflicts_with_subcommands`): after an option, a word is the program to launch.
/// The options that pick the mode are here; those the run consumes are [`Options`]' own fields.
#[derive(Parser, Debug)]
#[command(
    name = "memscope-bpf",
    version,
    help_template = HELP,
    after_help = EXAMPLES,
    args_conflicts_with_subcommands = true,
    args_override_self = true,
    disable_help_flag = true,
    disable_version_flag = true,
    disable_help_subcommand = true,
    subcommand_help_heading = "COMMANDS"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Sub>,

    /// Attach to the running process PID instead of launching one
    #[arg(long, value_name = "PID", help_heading = "TARGET SELECTION", value_parser = Check(v::pid))]
    pub pid: Option<u32>,

    /// Compare two dump files instead of tracing (needs --input-path)
    #[arg(long, help_heading = "TARGET SELECTION")]
    pub compare: bool,

    /// The two dump files to compare (regular files, not symlinks,
    /// at most 8 GiB each); dumps are CSV or db files, ours or msMemScope's
    #[arg(short, long, alias = "input", value_name = "A>,<B", help_heading = "TARGET SELECTION",
        value_parser = Check(v::compare_inputs), verbatim_doc_comment)]
    pub input_path: Option<[PathBuf; 2]>,

    #[command(flatten)]
    pub opts: Options,

    /// Output directory [default: ./memscopeDumpResults]
    /// [alias: --output, deprecated]
    #[arg(short, long, alias = "output", value_name = "DIR", help_heading = "OUTPUT",
        value_parser = Check(v::output_dir), verbatim_doc_comment)]
    pub output_path: Option<PathBuf>,

    /// Keep only events inside these mstx steps (integers >= 1,
    /// at most 5); turns leak analysis off
    #[arg(long, value_name = "LIST", help_heading = "WHAT TO COLLECT",
        value_parser = Check(v::steps), verbatim_doc_comment)]
    pub steps: Option<List<u32>>,

    #[command(flatten)]
    pub sites: SiteArgs,

    #[command(flatten)]
    pub log: LogArgs,

    /// Print the version and exit
    #[arg(short = 'V', long, action = ArgAction::Version, help_heading = "MISC")]
    pub version: Option<bool>,

    /// The program and its arguments, passed through untouched (not even UTF-8 is required).
    #[arg(trailing_var_arg = true, num_args = 1.., hide = true, value_parser = clap::value_parser!(OsString))]
    pub program: Vec<OsString>,
}

/// Everything the command line asked for, validated: clap fills each option field through its
/// value parser (adding an option is adding a field here); `parse_from` fills the `skip` ones.
#[derive(Args, Clone, Debug, PartialEq, Eq)]
pub struct Options {
    #[arg(skip = Mode::Attach { pid: 0 })]
    pub mode: Mode,
    /// Absolute output directory ("." and ".." resolved lexically; need not exist yet).
    #[arg(skip)]
    pub output_dir: PathBuf,
    /// Events to collect: `dump_events` plus the implied rules from events and analyses.
    #[arg(skip)]
    pub events: EventSet,
    /// `--steps`: only events inside these mstx steps are kept (empty = all).
    #[arg(skip)]
    pub steps: Vec<u32>,
    #[arg(skip)]
    pub log_level: LogLevel,
    /// Deprecation notices and other warnings for the caller to print on stderr.
    #[arg(skip)]
    pub warnings: Vec<String>,
    /// `analyze --by-site/--by-stack/--at/--timeline`.
    #[arg(skip)]
    pub sites: crate::report::SitesRequest,

    /// Library to attach the uprobes to, e.g. the driver's
    /// libascend_hal.so (repeatable)
    #[arg(long = "lib", value_name = "PATH", help_heading = "TARGET SELECTION",
        value_parser = Check(v::lib), verbatim_doc_comment)]
    pub libs: Vec<PathBuf>,

    /// Rotate dumps: start a new CSV file once one passes MIB MiB
    /// (1..=1048576), each a complete dump with its header
    /// [default: one file per device, no limit]
    #[arg(long, value_name = "MIB", help_heading = "TARGET SELECTION", verbatim_doc_comment,
        value_parser = Check(|o, v| v::count(o, v, 1..=1 << 20, "expected MiB from 1 to 1048576")))]
    pub max_file_mib: Option<u32>,

    /// With --max-file-mib: keep at most N dump files per device
    /// (1..=10000), deleting the oldest [default: keep all]
    #[arg(long, value_name = "N", help_heading = "TARGET SELECTION", verbatim_doc_comment,
        value_parser = Check(|o, v| v::count(o, v, 1..=10_000, "expected a count from 1 to 10000")))]
    pub max_files: Option<u32>,

    /// Under sudo, run the program as root; without it the program
    /// runs as the user who ran sudo (SUDO_UID, SUDO_GID and that
    /// user's groups) and the results belong to that user
    #[arg(long, help_heading = "TARGET SELECTION", verbatim_doc_comment)]
    pub as_root: bool,

    /// alloc | free | launch | access | none
    /// [default: alloc,free,launch]; alloc and free are always
    /// collected together, access implies both ('traceback' is
    /// accepted for compatibility and ignored)
    #[arg(long = "events", value_name = "LIST", help_heading = "WHAT TO COLLECT",
        default_value = "alloc,free,launch", verbatim_doc_comment,
        value_parser = Check(|o, v| v::spelled(o, v, EventSet::parse)))]
    pub dump_events: EventSet,

    /// op | kernel [default: op] (deprecated: 0 = op, 1 = kernel)
    #[arg(long = "level", value_name = "LIST", help_heading = "WHAT TO COLLECT",
        default_value = "op", value_parser = Check(|o, v| v::spelled(o, v, Levels::parse)))]
    pub levels: Levels,

    /// npu | npu:N (N < 32) | cpu [default: npu, i.e. every NPU]
    #[arg(long = "device", value_name = "LIST", help_heading = "WHAT TO COLLECT",
        default_value = "npu", value_parser = Check(v::parsed::<DeviceFilter>))]
    pub devices: DeviceFilter,

    /// c[:DEPTH] | python[:DEPTH], DEPTH 0..=1000 [default depth: 50];
    /// an empty value disables stacks [default: python:16 at the
    /// calls that allocate: the innermost 16 Python frames of a
    /// Python program, which hold the line of its own code each
    /// leak and site names; nothing for other programs; a value
    /// given here takes every call's stack];
    /// python: CPython 3.11-3.13 frames read from outside the
    /// process (Call Stack(Python) column); mixed: c and python,
    /// with the Python frames in the C column in place of the
    /// interpreter loop (_PyEval_EvalFrameDefault) running them
    #[arg(long, value_name = "LIST", help_heading = "WHAT TO COLLECT",
        default_value = crate::settings::DEFAULT_CALL_STACK,
        value_parser = Check(v::parsed::<CallStack>), verbatim_doc_comment)]
    pub call_stack: CallStack,

    /// immediate | deferred [default: immediate]
    #[arg(
        long,
        value_name = "MODE",
        help_heading = "WHAT TO COLLECT",
        default_value = "immediate"
    )]
    pub collect_mode: CollectMode,

    /// [START[:OUTID]],END[,full-content]: watch the outputs of
    /// op START until op END (the comma before END is required)
    #[arg(long, value_name = "SPEC", help_heading = "WHAT TO COLLECT",
        value_parser = Check(v::parsed::<WatchConfig>), verbatim_doc_comment)]
    pub watch: Option<WatchConfig>,

    /// BPF ring buffer size, a power of two 1..=1024 [default: 64]
    #[arg(long, value_name = "N", help_heading = "WHAT TO COLLECT",
        default_value_t = DEFAULT_RING_BUFFER_MIB,
        value_parser = Check(v::ring_buffer_mib))]
    pub ring_buffer_mib: u32,

    /// leaks | decompose | inefficient | oom[:K] | none
    /// [default: leaks]; K is 1..=1000 [default: 10]. Analyses add
    /// the events they need to the collection without writing them
    /// leaks: blocks never freed, per process and per mstx step
    /// decompose: bytes per owner (CANN@module, PTA, ATB, ... plus
    ///   labels a program sends as memscope-label-push/pop marks;
    ///   python/memscope_labels.py does it from Python)
    /// inefficient: early_allocation, late_deallocation and
    ///   temporary_idleness of PTA and ATB pool blocks
    /// oom: on an out-of-memory failure, the K newest and K largest
    ///   live blocks with their stacks
    #[arg(long, value_name = "LIST", help_heading = "ANALYSIS", default_value = "leaks",
        value_parser = Check(|o, v| v::spelled(o, v, AnalysisSet::parse)), verbatim_doc_comment)]
    pub analysis: AnalysisSet,

    /// csv | db [default: csv] [alias: --data-format, deprecated]
    #[arg(
        long,
        alias = "data-format",
        value_name = "FORMAT",
        help_heading = "OUTPUT",
        default_value = "csv"
    )]
    pub format: DataFormat,

    /// At the end, also write the HTML report of the run
    /// [default FILE: report.html in the process's directory]
    #[arg(long = "report", value_name = "FILE", help_heading = "OUTPUT", require_equals = true,
        value_parser = Check(v::output_file), verbatim_doc_comment)]
    pub report_at_end: Option<Option<PathBuf>>,

    /// Keep each traced process's PyTorch memory snapshot (the
    /// pickle of torch's _dump_snapshot(), for memory_viz) and
    /// write it as memory_snapshot.pickle in the process's
    /// directory when it ends; SIGUSR1 to memscope-bpf writes one
    /// of every live process now (memory_snapshot_<TIME>.pickle)
    #[arg(long, help_heading = "OUTPUT", verbatim_doc_comment)]
    pub memory_snapshot: bool,
}

#[derive(Subcommand, Debug)]
pub enum Sub {
    /// Leak analysis, sites and timeline of a saved dump ('-- analyze' runs a program)
    #[command(after_help = "Only these options apply.", args_override_self = true)]
    Analyze(AnalyzeArgs),
    /// HTML report (and Perfetto, folded, speedscope files) of a run, or of two compared
    #[command(args_override_self = true)]
    Report(ReportArgs),
    /// Node agent for Prometheus and pprof, tracing every process using the probed libraries
    ///
    /// memscope-bpf agent: an always-on node agent. Traces every process on the host that calls
    /// a probed library (CANN and torch_npu on Ascend, MindSpore's pool, the CUDA runtime and
    /// torch's c10 on NVIDIA; those running now and those started later), keeps per-process,
    /// per-device memory state, and serves it to Prometheus (/metrics) and pprof tools
    /// (/debug/pprof/heap).
    #[command(
        after_help = crate::agent::options::ENDPOINTS,
        verbatim_doc_comment,
        args_override_self = true,
        help_template = "{about}\n\nUSAGE:\n    {usage}\n\nOPTIONS:\n{options}{after-help}"
    )]
    Agent(crate::agent::options::AgentOptions),
}

/// `--drop-frames`: tracing, `analyze` and `report` name sites the same way.
#[derive(Args, Debug, Default)]
pub struct SiteArgs {
    /// Frames to pass over when naming the line that asked for
    /// memory (every leak, site and flame graph names it), besides
    /// the framework's own (torch, torch_npu, the Python standard
    /// library), the vendor's (hal*, acl*, CANN, ...) and allocator
    /// wrappers (functions named *alloc*): comma-separated
    /// substrings of a function or file name, e.g.
    /// --drop-frames=my_pool_,/vendored/ (docs/report.md)
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        help_heading = "ANALYSIS",
        verbatim_doc_comment
    )]
    pub drop_frames: Vec<String>,
}

/// `--log-level`, `-v`, `-q`: every mode has them.
#[derive(Args, Debug, Default)]
pub struct LogArgs {
    /// debug | info | warning | error [default: info]
    #[arg(long, value_name = "LEVEL", help_heading = "MISC",
        value_parser = Check(|o, v| v::spelled(o, v, LogLevel::parse)))]
    pub log_level: Option<LogLevel>,
    /// Same as --log-level=debug
    #[arg(short, long, visible_alias = "debug", help_heading = "MISC")]
    pub verbose: bool,
    /// Same as --log-level=error (an explicit --log-level wins)
    #[arg(short, long, help_heading = "MISC")]
    pub quiet: bool,
    /// Print this help and exit
    #[arg(short, long, action = ArgAction::HelpShort, help_heading = "MISC")]
    pub help: Option<bool>,
}

impl LogArgs {
    pub fn level(&self) -> LogLevel {
        match self.log_level {
            Some(level) => level,
            None if self.verbose => LogLevel::Debug,
            None if self.quiet => LogLevel::Error,
            None => LogLevel::Info,
        }
    }
}

/// `analyze`: the leak analysis (and sites, timeline) of a saved dump.
#[derive(Args, Debug)]
pub struct AnalyzeArgs {
    /// The dump to analyze (a regular file, not a symlink, at most
    /// 8 GiB): HAL blocks never freed are reported as leaks
    /// (summary on stderr, leaks_<ts>.csv under --output-path),
    /// and the dump is replayed through decompose, inefficient
    /// and the OOM rows it holds.
    #[arg(short, long, alias = "input", value_name = "DUMP", value_parser = Check(v::analyze_input),
        verbatim_doc_comment)]
    pub input_path: Option<PathBuf>,

    /// Output directory [default: ./memscopeDumpResults]
    #[arg(short, long, alias = "output", value_name = "DIR", value_parser = Check(v::output_dir))]
    pub output_path: Option<PathBuf>,

    /// Also print live bytes per allocation site (file:line of
    /// the innermost frame outside vendor and framework code),
    /// largest first; needs a dump traced with --call-stack=c
    #[arg(long, verbatim_doc_comment)]
    pub by_site: bool,

    /// Same, per whole call stack
    #[arg(long)]
    pub by_stack: bool,

    /// exit | peak | SECONDS after the dump's first event
    /// [default: exit]: when --by-site/--by-stack look
    #[arg(long, value_name = "WHEN", value_parser = Check(v::parsed::<At>), verbatim_doc_comment)]
    pub at: Option<At>,

    /// Write memscope_timeline_<MS>ms.csv under -o: the local
    /// maximum per device in each MS-ms interval [default: 100]
    /// and the site holding the most then
    #[arg(long, value_name = "MS", require_equals = true, verbatim_doc_comment,
        value_parser = Check(|o, v| v::count(o, v, 1..=3_600_000, "expected an interval in milliseconds, 1..=3600000")))]
    pub timeline: Option<Option<u32>>,

    #[command(flatten)]
    pub sites: SiteArgs,

    #[command(flatten)]
    pub log: LogArgs,
}

/// `report`: draw a run.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// A run: an --output-path directory, a process directory or
    /// one dump (ours or msMemScope's, CSV or db); with RUN2, the
    /// report also compares the two runs (RUN is the base)
    #[arg(short, long, alias = "input", value_name = "RUN>[,<RUN2",
        value_parser = Check(v::report_inputs), verbatim_doc_comment)]
    pub input_path: Option<List<PathBuf>>,

    /// Output directory [default: the current directory], as in
    /// every mode: the page is DIR/memscope_report.html, the other
    /// formats beside it, named after it. (A path ending in .html
    /// names the page itself, as before; deprecated)
    #[arg(short, long, alias = "output", value_name = "DIR", value_parser = Check(v::report_output),
        verbatim_doc_comment)]
    pub output_path: Option<PathBuf>,

    /// html | perfetto | folded | speedscope [default: html]
    /// perfetto: memscope_report.perfetto.json (ui.perfetto.dev,
    ///   chrome://tracing); folded: memscope_report.exit.folded
    ///   and .peak.folded (flamegraph.pl); speedscope:
    ///   memscope_report.speedscope.json, live bytes at the end
    ///   and at the peak
    #[arg(long, value_name = "LIST", value_parser = Check(v::parsed::<Formats>), default_value = "html",
        verbatim_doc_comment)]
    pub format: Formats,

    /// Same as adding perfetto to --format
    #[arg(long)]
    pub perfetto: bool,

    #[command(flatten)]
    pub sites: SiteArgs,

    #[command(flatten)]
    pub log: LogArgs,
}

/// Deprecated spellings (clap aliases of the new ones): each given draws a notice.
pub const DEPRECATED: [(&str, &str); 3] = [
    ("--input", "--input-path"),
    ("--output", "--output-path"),
    ("--data-format", "--format"),
];

const _: () = assert!(MAX_NPU_SLOTS == 32, "the --device help says N < 32");
