//! `memscope-bpf agent` options, parsed in the same hand-written style as `cli.rs`
//! (`--name=value` or `--name value`; usage errors exit 2 and say what is accepted).

use std::{ffi::OsString, net::SocketAddr, path::PathBuf, time::Duration};

use crate::cli::{CliError, LogLevel};

pub const AGENT_HELP: &str = "\
memscope-bpf agent: an always-on node agent. Traces every process on the host that maps the
Ascend libraries (those running now and those started later), keeps per-process, per-device
memory state, and serves it to Prometheus (/metrics) and pprof tools (/debug/pprof/heap).

USAGE:
    memscope-bpf agent [OPTIONS]

OPTIONS:
    --listen ADDR            HTTP address to serve on [default: 127.0.0.1:9464]. Binding to a
                             non-loopback address exposes process names and stacks to the network.
    --lib PATH               A library to probe from the start (repeatable), e.g. a CANN
                             install's libascend_hal.so; others are found as processes open them
    --sample-bytes N         Mean number of allocated bytes between two allocations whose call
                             stack is kept (byte-weighted Poisson sampling; a block of N bytes or
                             more is always kept; 0 keeps every stack) [default: 524288]
    --stack-depth D          Frames per sampled stack; 0 turns stacks (and pprof sites) off
                             [default: 32]
    --python-depth D         Python frames per sampled stack of a CPython process (PyTorch
                             jobs): they take the place of the interpreter loop in the stacks
                             and the pprof profile; 0 leaves them out [default: 32]
    --leak-steps K           A block still live K steps after the step it was allocated in is a
                             leak suspect [default: 3]
    --snapshot-ms MS         How often live bytes, peaks and leak suspects are recomputed
                             [default: 1000]
    --keep-exited SECS       How long an exited process's final state stays in /metrics
                             [default: 300]; at most --max-exited of them are kept [default: 256]
    --heap-profile-out FILE  On shutdown, write the node's heap profile (gzipped profile.proto,
                             the same as /debug/pprof/heap) to FILE
    --ring-buffer-mib N      BPF ring buffer size in MiB, a power of two [default: 64]
    --log-level LEVEL        error, warn, info or debug [default: info]
    -h, --help               Print this help

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

#[derive(Clone, Debug, PartialEq)]
pub struct AgentOptions {
    pub listen: SocketAddr,
    pub libs: Vec<PathBuf>,
    pub sample_bytes: u64,
    pub stack_depth: usize,
    pub python_depth: usize,
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
            python_depth: 32,
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

fn number<T: std::str::FromStr>(name: &str, v: &str, what: &str) -> Result<T, CliError> {
    v.parse().map_err(|_| {
        CliError::usage(format!(
            "invalid --{name} value '{v}': expected {what} (see 'memscope-bpf agent --help')"
        ))
    })
}

/// Parses the arguments after `agent`.
pub fn parse(args: &[OsString]) -> Result<AgentOptions, CliError> {
    let mut o = AgentOptions::default();
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].to_string_lossy().into_owned();
        i += 1;
        if arg == "-h" || arg == "--help" {
            return Err(CliError {
                message: AGENT_HELP.to_string(),
                exit_code: 0,
            });
        }
        let Some(body) = arg.strip_prefix("--") else {
            return Err(CliError::usage(format!(
                "unexpected argument '{arg}': the agent takes no program or pid, it traces every \
                 process using the Ascend libraries (see 'memscope-bpf agent --help')"
            )));
        };
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (body.to_string(), None),
        };
        let known = [
            "listen",
            "lib",
            "sample-bytes",
            "stack-depth",
            "python-depth",
            "leak-steps",
            "snapshot-ms",
            "keep-exited",
            "max-exited",
            "heap-profile-out",
            "ring-buffer-mib",
            "log-level",
        ];
        if !known.contains(&name.as_str()) {
            return Err(CliError::usage(format!(
                "unknown agent option '--{name}' (see 'memscope-bpf agent --help')"
            )));
        }
        let value = match inline {
            Some(v) => v,
            None => {
                let Some(v) = args.get(i) else {
                    return Err(CliError::usage(format!("--{name} needs a value")));
                };
                i += 1;
                v.to_string_lossy().into_owned()
            }
        };
        match name.as_str() {
            "listen" => {
                o.listen = value.parse().map_err(|_| {
                    CliError::usage(format!(
                        "invalid --listen value '{value}': expected IP:PORT, e.g. 127.0.0.1:9464"
                    ))
                })?
            }
            "lib" => {
                let p = PathBuf::from(&value);
                if !p.is_file() {
                    return Err(CliError::usage(format!(
                        "invalid --lib value '{value}': not a file"
                    )));
                }
                o.libs.push(p);
            }
            "sample-bytes" => o.sample_bytes = number(&name, &value, "a byte count")?,
            "stack-depth" => {
                o.stack_depth = number(&name, &value, "a frame count from 0 to 128")?;
                if o.stack_depth > 128 {
                    return Err(CliError::usage(format!(
                        "invalid --stack-depth value '{value}': at most 128 frames"
                    )));
                }
            }
            "python-depth" => {
                o.python_depth = number(&name, &value, "a frame count from 0 to 128")?;
                if o.python_depth > 128 {
                    return Err(CliError::usage(format!(
                        "invalid --python-depth value '{value}': at most 128 frames"
                    )));
                }
            }
            "leak-steps" => {
                o.leak_steps = number(&name, &value, "a step count of at least 1")?;
                if o.leak_steps == 0 {
                    return Err(CliError::usage(
                        "invalid --leak-steps value '0': a block is a suspect after at least 1 step",
                    ));
                }
            }
            "snapshot-ms" => {
                let ms: u64 = number(&name, &value, "milliseconds from 100 to 60000")?;
                if !(100..=60_000).contains(&ms) {
                    return Err(CliError::usage(format!(
                        "invalid --snapshot-ms value '{value}': from 100 to 60000"
                    )));
                }
                o.snapshot = Duration::from_millis(ms);
            }
            "keep-exited" => o.keep_exited = Duration::from_secs(number(&name, &value, "seconds")?),
            "max-exited" => o.max_exited = number(&name, &value, "a process count")?,
            "heap-profile-out" => o.heap_profile_out = Some(PathBuf::from(value)),
            "ring-buffer-mib" => {
                let n: u32 = number(&name, &value, "a power of two from 1 to 1024")?;
                if !n.is_power_of_two() || n > 1024 {
                    return Err(CliError::usage(format!(
                        "invalid --ring-buffer-mib value '{value}': a power of two from 1 to 1024"
                    )));
                }
                o.ring_buffer_mib = n;
            }
            "log-level" => {
                o.log_level = match value.as_str() {
                    "error" => LogLevel::Error,
                    "warn" | "warning" => LogLevel::Warning,
                    "info" => LogLevel::Info,
                    "debug" => LogLevel::Debug,
                    _ => {
                        return Err(CliError::usage(format!(
                            "invalid --log-level value '{value}': error, warn, info or debug"
                        )));
                    }
                }
            }
            _ => unreachable!("checked against `known`"),
        }
    }
    Ok(o)
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
            "--python-depth",
            "0",
        ])
        .unwrap();
        assert_eq!(o.python_depth, 0);
        assert_eq!(p(&[]).unwrap().python_depth, 32);
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
            (&["--python-depth=200"][..], "at most 128 frames"),
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
