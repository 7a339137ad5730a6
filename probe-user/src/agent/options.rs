//! `memscope-bpf agent` options: a clap `Args` struct, the `agent` subcommand of the main
//! command line (`cli`), parsed and reported like it (`--name=value` or `--name value`; usage
//! errors exit 2 and say what is accepted). Each option is one field with its default.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::Args;

use crate::settings::LogLevel;

pub const ENDPOINTS: &str = "\
ENDPOINTS:
    /metrics                      OpenMetrics when Accept asks for it (Prometheus
                                  does), else the Prometheus text format 0.0.4;
                                  per process: pid, comm, container, pod_uid
    /ready                        200 once the probes are in place, 503 before
    /debug/pprof/heap             node-wide heap profile (inuse_space, inuse_objects,
                                  alloc_space, alloc_objects), gzipped profile.proto
    /debug/pprof/heap?pid=PID     the same for one process
    /debug/memory_snapshot?pid=PID
                                  (--memory-snapshot) the process's PyTorch memory snapshot,
                                  a pickle for memory_viz (python -m torch.cuda._memory_viz)

SIGTERM, SIGINT or SIGHUP detaches the probes and exits 0. There is no authentication: every
local user (every client, with a non-loopback --listen) reads every traced process's names,
memory and stacks. Requests must name the agent by IP address, localhost, this host's name or
an --allow-host name; at most 32 connections are served at once (docs/security.md).

EXAMPLES:
    sudo memscope-bpf agent
    sudo memscope-bpf agent --listen 0.0.0.0:9464 --lib /usr/local/Ascend/driver/lib64/libascend_hal.so
    go tool pprof -top http://127.0.0.1:9464/debug/pprof/heap";

/// What the agent serves and how (see `memscope-bpf agent --help`).
#[derive(Args, Clone, Debug, PartialEq, Eq)]
pub struct AgentOptions {
    /// HTTP address to serve on [default: 127.0.0.1:9464]. Binding to a
    /// non-loopback address exposes process names and stacks to the network.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9464", value_parser = parse_listen,
        verbatim_doc_comment)]
    pub listen: SocketAddr,
    /// A name clients may reach the agent by (repeatable), besides IP
    /// addresses, localhost and this host's own name: requests with any
    /// other Host header are refused (a web page cannot read the agent
    /// through a DNS name of its own)
    #[arg(long = "allow-host", value_name = "NAME", verbatim_doc_comment)]
    pub allow_hosts: Vec<String>,
    /// A library to probe from the start (repeatable), e.g. a CANN
    /// install's libascend_hal.so; others are found as processes open them
    #[arg(long = "lib", value_name = "PATH", value_parser = parse_lib, verbatim_doc_comment)]
    pub libs: Vec<PathBuf>,
    /// Mean number of allocated bytes between two allocations whose call
    /// stack is kept (byte-weighted Poisson sampling; a block of N bytes or
    /// more is always kept; 0 keeps every stack) [default: 524288]
    #[arg(long, value_name = "N", default_value = "524288", verbatim_doc_comment,
        value_parser = |v: &str| number(v, "a byte count", 0..=u64::MAX))]
    pub sample_bytes: u64,
    /// Frames per sampled stack; 0 turns stacks (and pprof sites) off
    /// [default: 32]
    #[arg(long, value_name = "D", default_value = "32", verbatim_doc_comment,
        value_parser = |v: &str| number(v, "a frame count from 0 to 128", 0..=128).map(|n| n as usize))]
    pub stack_depth: usize,
    /// Python frames per sampled stack of a CPython process (PyTorch
    /// jobs): they take the place of the interpreter loop in the stacks
    /// and the pprof profile; 0 leaves them out [default: 32]
    #[arg(long, value_name = "D", default_value = "32", verbatim_doc_comment,
        value_parser = |v: &str| number(v, "a frame count from 0 to 128", 0..=128).map(|n| n as usize))]
    pub python_depth: usize,
    /// A block still live K steps after the step it was allocated in is a
    /// leak suspect [default: 3]
    #[arg(long, value_name = "K", default_value = "3", verbatim_doc_comment,
        value_parser = |v: &str| number(v, "a step count of at least 1 (a block is a suspect after at least 1 step)", 1..=u64::from(u32::MAX)).map(|n| n as u32))]
    pub leak_steps: u32,
    /// How often live bytes, peaks and leak suspects are recomputed
    /// [default: 1000]
    #[arg(long = "snapshot-ms", value_name = "MS", default_value = "1000", verbatim_doc_comment,
        value_parser = |v: &str| number(v, "milliseconds from 100 to 60000", 100..=60_000).map(Duration::from_millis))]
    pub snapshot: Duration,
    /// How long an exited process's final state stays in /metrics
    /// [default: 300]; at most --max-exited of them are kept
    #[arg(long, value_name = "SECS", default_value = "300", verbatim_doc_comment,
        value_parser = |v: &str| number(v, "seconds", 0..=u64::MAX).map(Duration::from_secs))]
    pub keep_exited: Duration,
    /// How many exited processes stay in /metrics at most [default: 256]
    #[arg(long, value_name = "N", default_value = "256",
        value_parser = |v: &str| number(v, "a process count", 0..=u64::MAX).map(|n| n as usize))]
    pub max_exited: usize,
    /// Keep each traced process's PyTorch memory snapshot (the pickle of
    /// torch's _dump_snapshot(), for memory_viz), served at
    /// /debug/memory_snapshot?pid=PID; the newest 10000 actions per
    /// device are kept, and frames only for sampled stacks
    #[arg(long, verbatim_doc_comment)]
    pub memory_snapshot: bool,
    /// On shutdown, write the node's heap profile (gzipped profile.proto,
    /// the same as /debug/pprof/heap) to FILE
    #[arg(long, value_name = "FILE", verbatim_doc_comment)]
    pub heap_profile_out: Option<PathBuf>,
    /// Hold a process that opens a vendor library not yet probed for it
    /// at that open until its probes are in place (bounded by a 1 s
    /// watchdog), so a job's first calls are seen (docs/agent.md). The
    /// default. Other memscope-bpf tracers on the node (a launch session,
    /// another agent) hold it at the same open: it runs on once every
    /// tracer that stopped it has its probes in place
    #[arg(long, overrides_with = "no_hold", verbatim_doc_comment)]
    pub hold: bool,
    /// Never stop a process. A job that loads a vendor library from a
    /// path the agent has not probed yet may run before its probes are
    /// in place: its first allocations (a model's weights) are missed
    #[arg(long, overrides_with = "hold", verbatim_doc_comment)]
    pub no_hold: bool,
    /// BPF ring buffer size in MiB, a power of two [default: 64]
    #[arg(long, value_name = "N", default_value = "64", value_parser = parse_ring_buffer)]
    pub ring_buffer_mib: u32,
    /// error, warn, info or debug [default: info]
    #[arg(long, value_name = "LEVEL", default_value = "info", value_parser = parse_log_level)]
    pub log_level: LogLevel,
    /// Print this help and exit
    #[arg(short, long, action = clap::ArgAction::Help)]
    pub help: Option<bool>,
}

impl AgentOptions {
    /// Whether the agent holds a process at a vendor library's open: unless `--no-hold` came
    /// last (`--hold`, the default, is accepted still).
    pub fn holds(&self) -> bool {
        !self.no_hold
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
