//! `memscope-bpf agent` options: a clap derive struct, parsed and reported like the main
//! command line (`--name=value` or `--name value`; usage errors exit 2 and say what is accepted).

use std::{ffi::OsString, net::SocketAddr, path::PathBuf, time::Duration};

use clap::{CommandFactory, FromArgMatches, Parser};

use crate::cli::CliError;
use crate::settings::LogLevel;

const ENDPOINTS: &str = "\
ENDPOINTS:
    /metrics                      Prometheus text exposition format
    /ready                        200 once the probes are in place, 503 before
    /debug/pprof/heap             node-wide heap profile (inuse_space, inuse_objects,
                                  alloc_space, alloc_objects), gzipped profile.proto
    /debug/pprof/heap?pid=PID     the same for one process

SIGTERM or SIGINT detaches the probes and exits 0.

EXAMPLES:
    sudo memscope-bpf agent
    sudo memscope-bpf agent --listen 0.0.0.0:9464 --lib /usr/local/Ascend/driver/lib64/libascend_hal.so
    go tool pprof -top http://127.0.0.1:9464/debug/pprof/heap";

/// memscope-bpf agent: an always-on node agent. Traces every process on the host that maps the
/// Ascend libraries (those running now and those started later), keeps per-process, per-device
/// memory state, and serves it to Prometheus (/metrics) and pprof tools (/debug/pprof/heap).
#[derive(Parser, Debug)]
#[command(
    name = "memscope-bpf agent",
    bin_name = "memscope-bpf agent",
    after_help = ENDPOINTS,
    args_override_self = true,
    disable_version_flag = true,
    verbatim_doc_comment,
    help_template = "{about}\n\nUSAGE:\n    {usage}\n\nOPTIONS:\n{options}{after-help}"
)]
struct AgentArgs {
    /// HTTP address to serve on [default: 127.0.0.1:9464]. Binding to a
    /// non-loopback address exposes process names and stacks to the network.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen, verbatim_doc_comment)]
    listen: Option<SocketAddr>,
    /// A library to probe from the start (repeatable), e.g. a CANN
    /// install's libascend_hal.so; others are found as processes open them
    #[arg(long, value_name = "PATH", value_parser = parse_lib, verbatim_doc_comment)]
    lib: Vec<PathBuf>,
    /// Mean number of allocated bytes between two allocations whose call
    /// stack is kept (byte-weighted Poisson sampling; a block of N bytes or
    /// more is always kept; 0 keeps every stack) [default: 524288]
    #[arg(long, value_name = "N", value_parser = |v: &str| number(v, "a byte count", 0..=u64::MAX), verbatim_doc_comment)]
    sample_bytes: Option<u64>,
    /// Frames per sampled stack; 0 turns stacks (and pprof sites) off
    /// [default: 32]
    #[arg(long, value_name = "D", value_parser = |v: &str| number(v, "a frame count from 0 to 128", 0..=128), verbatim_doc_comment)]
    stack_depth: Option<u64>,
    /// A block still live K steps after the step it was allocated in is a
    /// leak suspect [default: 3]
    #[arg(long, value_name = "K", verbatim_doc_comment,
        value_parser = |v: &str| number(v, "a step count of at least 1 (a block is a suspect after at least 1 step)", 1..=u64::from(u32::MAX)))]
    leak_steps: Option<u64>,
    /// How often live bytes, peaks and leak suspects are recomputed
    /// [default: 1000]
    #[arg(long, value_name = "MS", value_parser = |v: &str| number(v, "milliseconds from 100 to 60000", 100..=60_000), verbatim_doc_comment)]
    snapshot_ms: Option<u64>,
    /// How long an exited process's final state stays in /metrics
    /// [default: 300]; at most --max-exited of them are kept
    #[arg(long, value_name = "SECS", value_parser = |v: &str| number(v, "seconds", 0..=u64::MAX), verbatim_doc_comment)]
    keep_exited: Option<u64>,
    /// How many exited processes stay in /metrics at most [default: 256]
    #[arg(long, value_name = "N", value_parser = |v: &str| number(v, "a process count", 0..=u64::MAX))]
    max_exited: Option<u64>,
    /// On shutdown, write the node's heap profile (gzipped profile.proto,
    /// the same as /debug/pprof/heap) to FILE
    #[arg(long, value_name = "FILE", verbatim_doc_comment)]
    heap_profile_out: Option<PathBuf>,
    /// BPF ring buffer size in MiB, a power of two [default: 64]
    #[arg(long, value_name = "N", value_parser = parse_ring_buffer)]
    ring_buffer_mib: Option<u32>,
    /// error, warn, info or debug [default: info]
    #[arg(long, value_name = "LEVEL", value_parser = parse_log_level)]
    log_level: Option<LogLevel>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct AgentOptions {
    pub listen: SocketAddr,
    pub libs: Vec<PathBuf>,
    pub sample_bytes: u64,
    pub stack_depth: usize,
    pub leak_steps: u32,
    pub snapshot: Duration,
    pub keep_exited: Duration,
    pub max_exited: usize,
    pub heap_profile_out: Option<PathBuf>,
    pub ring_buffer_mib: u32,
    pub log_level: LogLevel,
}

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
            libs: Vec::new(),
            sample_bytes: 512 * 1024,
            stack_depth: 32,
            leak_steps: 3,
            snapshot: Duration::from_millis(1000),
            keep_exited: Duration::from_secs(300),
            max_exited: 256,
            heap_profile_out: None,
            ring_buffer_mib: 64,
            log_level: LogLevel::Info,
        }
    }
}

fn number(v: &str, what: &str, range: std::ops::RangeInclusive<u64>) -> Result<u64, String> {
    v.parse()
        .ok()
        .filter(|n| range.contains(n))
        .ok_or_else(|| format!("expected {what}"))
}

fn parse_listen(v: &str) -> Result<SocketAddr, String> {
    v.parse()
        .map_err(|_| "expected IP:PORT, e.g. 127.0.0.1:9464".to_owned())
}

fn parse_lib(v: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(v);
    p.is_file()
        .then_some(p)
        .ok_or_else(|| "not a file".to_owned())
}

fn parse_ring_buffer(v: &str) -> Result<u32, String> {
    let n = number(v, "a power of two from 1 to 1024", 1..=1024)?;
    n.is_power_of_two()
        .then_some(n as u32)
        .ok_or_else(|| "expected a power of two from 1 to 1024".to_owned())
}

fn parse_log_level(v: &str) -> Result<LogLevel, String> {
    match v {
        "error" => Ok(LogLevel::Error),
        "warn" | "warning" => Ok(LogLevel::Warning),
        "info" => Ok(LogLevel::Info),
        "debug" => Ok(LogLevel::Debug),
        _ => Err("error, warn, info or debug".to_owned()),
    }
}

/// The agent's help text.
pub fn help_text() -> String {
    AgentArgs::command().render_help().to_string()
}

/// Parses the arguments after `agent`.
pub fn parse(args: &[OsString]) -> Result<AgentOptions, CliError> {
    let argv: Vec<OsString> = ["memscope-bpf", "agent"]
        .map(OsString::from)
        .into_iter()
        .chain(args.iter().cloned())
        .collect();
    let command = AgentArgs::command().mut_args(crate::cli::hyphen_values);
    let matches = command
        .try_get_matches_from(&argv[1..])
        .and_then(|m| AgentArgs::from_arg_matches(&m))
        .map_err(|e| crate::cli::from_clap(e, &argv))?;
    let d = AgentOptions::default();
    Ok(AgentOptions {
        listen: matches.listen.unwrap_or(d.listen),
        libs: matches.lib,
        sample_bytes: matches.sample_bytes.unwrap_or(d.sample_bytes),
        stack_depth: matches.stack_depth.map_or(d.stack_depth, |n| n as usize),
        leak_steps: matches.leak_steps.map_or(d.leak_steps, |n| n as u32),
        snapshot: matches
            .snapshot_ms
            .map_or(d.snapshot, Duration::from_millis),
        keep_exited: matches
            .keep_exited
            .map_or(d.keep_exited, Duration::from_secs),
        max_exited: matches.max_exited.map_or(d.max_exited, |n| n as usize),
        heap_profile_out: matches.heap_profile_out,
        ring_buffer_mib: matches.ring_buffer_mib.unwrap_or(d.ring_buffer_mib),
        log_level: matches.log_level.unwrap_or(d.log_level),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<AgentOptions, CliError> {
        parse(&args.iter().map(OsString::from).collect::<Vec<_>>())
    }

    #[test]
    fn defaults_and_both_value_spellings() {
        let o = p(&[]).unwrap();
        assert_eq!(o.listen.to_string(), "127.0.0.1:9464");
        assert_eq!(o.sample_bytes, 524288);
        let o = p(&[
            "--listen=127.0.0.1:1234",
            "--sample-bytes",
            "0",
            "--leak-steps=2",
        ])
        .unwrap();
        assert_eq!(o.listen.port(), 1234);
        assert_eq!(o.sample_bytes, 0);
        assert_eq!(o.leak_steps, 2);
    }

    #[test]
    fn bad_values_are_usage_errors_that_say_what_is_accepted() {
        for (args, needle) in [
            (&["--listen", "nowhere"][..], "IP:PORT"),
            (&["--ring-buffer-mib=3"][..], "power of two"),
            (&["--leak-steps=0"][..], "at least 1 step"),
            (&["--bogus"][..], "unknown agent option"),
            (&["1234"][..], "takes no program or pid"),
            (&["--lib"][..], "needs a value"),
        ] {
            let e = p(args).unwrap_err();
            assert_eq!(e.exit_code, 2, "{args:?}");
            assert!(e.message.contains(needle), "{args:?}: {}", e.message);
        }
        assert_eq!(p(&["--help"]).unwrap_err().exit_code, 0);
    }
}
