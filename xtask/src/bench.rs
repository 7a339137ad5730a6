//! `cargo xtask bench`: the benchmark suite, side by side, several rounds each. Writes
//! `docs/benchmarks.md` (tables: median and spread, machine, kernel, date) and the raw
//! numbers (`docs/benchmarks/raw.csv`, `docs/benchmarks/results.json`).
//!
//! Sections (each can be picked with `--only NAME`; each is a module under `bench/`, which
//! adds its methods to `Bench`; this file keeps the options, the runner and the helpers they
//! share):
//! * `insn`: uprobe cost by the probed function's first instruction (tracefs uprobe events
//!   on `tests/fixtures/bench/uprobe_insns.S`): which instructions the kernel emulates,
//!   single-steps or refuses. placement.rs cites this table.
//! * `overhead`: `bench_loop` (tight loop, and with host work between calls) (a) untraced,
//!   (b) under empty BPF programs at the same points (the kernel's floor), (c) under
//!   memscope-bpf, (d) under an equivalent bpftrace script, (e) under an LD_PRELOAD
//!   interposer; plus (b) and (c) with naive entry placement.
//! * `placement`: `halMemFree` (first instruction `test`, not emulated) in a loop, naive
//!   entry placement against the placement rule, and the events recorded under both.
//! * `loss`: the tight loop with 4 threads for 60 s under memscope-bpf at the default ring size.
//! * `stacks`: cost per traced call of stack capture in BPF (`--call-stack=c:50`): none, the
//!   kernel's frame-pointer walk only (`MEMSCOPE_BPF_STACK_MODE=fp`), and the default (walk +
//!   8 KiB stack copy for CFI unwinding), on the tight loop; with the events lost.
//! * `torch`: the cost per PyTorch operation on the released torch + torch_npu wheels: a
//!   dispatch-bound loop untraced and under each configuration (defaults, each
//!   `--call-stack`, the agent, the empty-program floor), per iteration the traced thread's
//!   CPU, wall time, the tracer's CPU and the probe hits (`bench/torch.rs`).
//! * `symbols`: `symbols/examples/symbolize_bench.rs`: warm symbolization rate (addresses/s),
//!   unwinding rate (stacks/s), and the cold start on the largest shared object on the machine.
//! * `agent`: the node agent's overhead on the HAL loop and its CPU use at a given event rate
//!   (`bench/agent.rs`).
//! * `agent-soak`: thousands of short traced jobs through one agent: its descriptors, threads
//!   and memory before and after (`bench/soak.rs`, the test `agent_soak` at full size).
//! * `replay`: user-space throughput: ≥ 10 M synthetic events through decode, tracker, each
//!   writer and the leak analysis (`probe-user/examples/replay.rs`), with peak RSS.
//! * `report`: the HTML report of a 10 M-event dump (written by the replay example): time to
//!   build it, its size, and its first paint in headless Chromium (the page's own measure from
//!   navigation start to every chart drawn, and the wall time of `chromium --dump-dom`).
//!
//! * `harm`: what tracing costs processes that are not traced, and what stays after the
//!   tracer is gone (`harm.rs`): an untraced neighbour's HAL loop while another process is
//!   traced, the traced target's and the neighbour's loop 0.5 s after the tracer exits,
//!   attach and detach time of 10/100/1000 probes, launch-mode start-up of a program loading
//!   200 shared objects, and `--pid` to "attached" on a process mapping large libraries; each
//!   against no tracer and against system-wide probes with one perf link per probe (the
//!   design before per-process multi-uprobe links). Also written to docs/benchmarks-harm.md.
//!
//! Nothing here runs in CI or asserts times.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result, bail};

use crate::{cmd, setup};

mod agent;
mod harm;
mod insn;
mod loss;
mod overhead;
mod placement;
mod replay;
mod report;
mod results;
mod soak;
mod stacks;
mod symbols;
mod torch;

const TAG: &str = "[bench]";

const SECTIONS: [&str; 12] = [
    "harm",
    "insn",
    "overhead",
    "stacks",
    "torch",
    "placement",
    "loss",
    "symbols",
    "replay",
    "report",
    "agent",
    "agent-soak",
];

#[derive(Clone, Debug)]
pub struct Options {
    pub quick: bool,
    pub rounds: usize,
    pub loss_seconds: u64,
    pub events: u64,
    pub only: Vec<String>,
    /// Write docs/benchmarks.md even for a partial run (`--only`): off by default.
    pub write_docs: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            quick: false,
            rounds: 5,
            loss_seconds: 60,
            events: 10_000_000,
            only: Vec::new(),
            write_docs: true,
        }
    }
}

pub fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| -> Result<String> {
            it.next()
                .cloned()
                .with_context(|| format!("{name} needs a value"))
        };
        match a.as_str() {
            "--quick" => {
                o.quick = true;
                o.rounds = 3;
                o.loss_seconds = 10;
                o.events = 2_000_000;
            }
            "--rounds" => o.rounds = value("--rounds")?.parse().context("--rounds N")?,
            "--loss-seconds" => {
                o.loss_seconds = value("--loss-seconds")?
                    .parse()
                    .context("--loss-seconds S")?
            }
            "--events" => o.events = value("--events")?.parse().context("--events N")?,
            "--only" => {
                for s in value("--only")?.split(',') {
                    if !SECTIONS.contains(&s) {
                        bail!("unknown section `{s}` (sections: {})", SECTIONS.join(", "));
                    }
                    o.only.push(s.to_string());
                }
            }
            other => bail!("unknown option for `bench`: `{other}`"),
        }
    }
    o.rounds = o.rounds.max(1);
    if !o.only.is_empty() {
        o.write_docs = false;
    }
    Ok(o)
}

/// One measured number.
#[derive(Clone, Debug)]
struct Sample {
    section: &'static str,
    workload: String,
    config: String,
    round: usize,
    metric: &'static str,
    value: f64,
}

struct Bench {
    repo: PathBuf,
    /// Setup's environment for the cargo commands a section runs.
    ready: setup::Ready,
    opts: Options,
    tracer: PathBuf,
    bin: PathBuf,
    lib: PathBuf,
    scratch: PathBuf,
    samples: Vec<Sample>,
    notes: Vec<String>,
    md: String,
}

pub fn run(repo: &Path, opts: Options) -> Result<u8> {
    if crate::effective_uid() != Some(0) {
        eprintln!("{TAG} the benchmarks attach uprobes and BPF programs: run as root");
        return Ok(1);
    }
    let ready = setup::run(repo, &setup::Options::default())?;
    let mut make = Command::new("make");
    make.args(["-C", "tests/fixtures", "all", "bench"])
        .current_dir(repo);
    cmd::output(&mut make)?;
    let mut build = crate::cargo(repo, &ready);
    build.args([
        "build",
        "--release",
        "-p",
        "memscope-bpf",
        "--bin",
        "memscope-bpf",
        "--example",
        "replay",
        "--example",
        "attach_cost",
    ]);
    println!("{TAG} + {}", cmd::describe(&build));
    let status = cmd::interactive(&mut build)?;
    if !status.success() {
        cmd::report_failure("bench", &build, status);
        return Ok(cmd::exit_code(status));
    }
    let mut build = crate::cargo(repo, &ready);
    build.args([
        "build",
        "--release",
        "-p",
        "memscope-symbols",
        "--example",
        "symbolize_bench",
    ]);
    println!("{TAG} + {}", cmd::describe(&build));
    let status = cmd::interactive(&mut build)?;
    if !status.success() {
        cmd::report_failure("bench", &build, status);
        return Ok(cmd::exit_code(status));
    }
    let target = match std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        Some(d) => repo.join(d),
        None => repo.join("target"),
    };
    let scratch = target.join("bench");
    fs::create_dir_all(&scratch)?;
    let mut b = Bench {
        repo: repo.to_path_buf(),
        ready,
        tracer: target.join("release/memscope-bpf"),
        bin: repo.join("tests/fixtures/build/bin"),
        lib: repo.join("tests/fixtures/build/lib"),
        scratch,
        opts,
        samples: Vec::new(),
        notes: Vec::new(),
        md: String::new(),
    };
    let started = Instant::now();
    let want = |s: &str| b.opts.only.is_empty() || b.opts.only.iter().any(|o| o == s);
    let (w_insn, w_over, w_place, w_loss, w_replay) = (
        want("insn"),
        want("overhead"),
        want("placement"),
        want("loss"),
        want("replay"),
    );
    let w_torch = want("torch");
    let (w_stacks, w_syms, w_report, w_harm, w_agent, w_soak) = (
        want("stacks"),
        want("symbols"),
        want("report"),
        want("harm"),
        want("agent"),
        want("agent-soak"),
    );
    if w_insn {
        b.insn()?;
    }
    if w_over {
        b.overhead()?;
    }
    if w_stacks {
        b.stacks()?;
    }
    if w_torch {
        b.torch()?;
    }
    if w_place {
        b.placement()?;
    }
    if w_loss {
        b.loss()?;
    }
    if w_syms {
        b.symbols(&target)?;
    }
    if w_replay {
        b.replay(&target)?;
    }
    if w_report {
        b.report(&target)?;
    }
    if w_harm {
        b.harm(&target)?;
    }
    if w_agent {
        b.agent()?;
    }
    if w_soak {
        b.agent_soak()?;
    }
    b.write(started.elapsed().as_secs_f64())?;
    Ok(0)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn spread(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

/// `key=value` from a `RESULT ...` line.
fn result_field(stdout: &str, key: &str) -> Option<f64> {
    tagged_field(stdout, "RESULT ", key)
}

fn result_ab_field(stdout: &str, key: &str) -> Option<f64> {
    tagged_field(stdout, "RESULT_AB ", key)
}

/// `key=<number>` from the first line starting with `tag`.
fn tagged_field(stdout: &str, tag: &str, key: &str) -> Option<f64> {
    let line = stdout.lines().find(|l| l.starts_with(tag))?;
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

fn fmt_ns(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// The ways a workload can be run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Config {
    Untraced,
    Floor,
    Memscope,
    FloorEntry,
    MemscopeEntry,
    Bpftrace,
    Preload,
}

impl Config {
    fn name(self) -> &'static str {
        match self {
            Config::Untraced => "(a) untraced",
            Config::Floor => "(b) empty BPF programs (floor)",
            Config::Memscope => "(c) memscope-bpf",
            Config::FloorEntry => "(b') floor, naive entry placement",
            Config::MemscopeEntry => "(c') memscope-bpf, naive entry placement",
            Config::Bpftrace => "(d) bpftrace",
            Config::Preload => "(e) LD_PRELOAD interposer",
        }
    }
    fn key(self) -> &'static str {
        match self {
            Config::Untraced => "untraced",
            Config::Floor => "floor",
            Config::Memscope => "memscope",
            Config::FloorEntry => "floor_entry",
            Config::MemscopeEntry => "memscope_entry",
            Config::Bpftrace => "bpftrace",
            Config::Preload => "preload",
        }
    }
}

struct RunOut {
    stdout: String,
    stderr: String,
}

impl Bench {
    fn sample(
        &mut self,
        section: &'static str,
        workload: &str,
        config: &str,
        round: usize,
        metric: &'static str,
        value: f64,
    ) {
        self.samples.push(Sample {
            section,
            workload: workload.into(),
            config: config.into(),
            round,
            metric,
            value,
        });
    }

    fn values(&self, section: &str, workload: &str, config: &str, metric: &str) -> Vec<f64> {
        self.samples
            .iter()
            .filter(|s| {
                s.section == section
                    && s.workload == workload
                    && s.config == config
                    && s.metric == metric
            })
            .map(|s| s.value)
            .collect()
    }

    fn exec(&self, mut c: Command) -> Result<RunOut> {
        // The tracer's uprobes must be gone when it exits, or they would keep firing (filtered
        // out) in the next measurement, untraced runs included.
        let out = c
            .current_dir(&self.repo)
            .env("MEMSCOPE_BPF_DETACH", "foreground")
            .stdin(std::process::Stdio::null())
            .output()
            .with_context(|| format!("cannot run {}", cmd::describe(&c)))?;
        let r = RunOut {
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
        if !out.status.success() {
            bail!(
                "`{}` failed ({}):\n{}\n{}",
                cmd::describe(&c),
                out.status,
                r.stdout,
                r.stderr
            );
        }
        Ok(r)
    }

    fn bpftrace_script(&self) -> String {
        let lib = self.lib.join("libascend_hal.so");
        let l = lib.display();
        // The same events memscope-bpf records: halMemAlloc's out-pointer read at return,
        // halMemFree's result, timestamps, pid/tid, one line per completed call.
        format!(
            "uprobe:{l}:halMemAlloc /pid == cpid/ {{ @pp[tid] = arg0; @sz[tid] = arg1; @fl[tid] = arg2; @t0[tid] = nsecs; }}\n\
             uretprobe:{l}:halMemAlloc /pid == cpid/ {{ printf(\"MALLOC %d %d 0x%lx %lu 0x%lx %d %lu %lu\\n\", pid, tid, *(uint64 *)uptr(@pp[tid]), @sz[tid], @fl[tid], retval, @t0[tid], nsecs); }}\n\
             uprobe:{l}:halMemFree /pid == cpid/ {{ @fp[tid] = arg0; @f0[tid] = nsecs; }}\n\
             uretprobe:{l}:halMemFree /pid == cpid/ {{ printf(\"FREE %d %d 0x%lx %d %lu %lu\\n\", pid, tid, @fp[tid], retval, @f0[tid], nsecs); }}\n"
        )
    }

    /// Runs `bench_loop ARGS` under `config`; returns (stdout, stderr).
    fn run_workload(&self, config: Config, args: &[String]) -> Result<RunOut> {
        let workload = self.bin.join("bench_loop");
        let out_dir = self.scratch.join("trace-out");
        let _ = fs::remove_dir_all(&out_dir);
        let c = match config {
            Config::Untraced => {
                let mut c = Command::new(&workload);
                c.args(args);
                c
            }
            Config::Preload => {
                let mut c = Command::new(&workload);
                c.args(args)
                    .env("LD_PRELOAD", self.lib.join("bench/libbench_preload.so"));
                c
            }
            Config::Bpftrace => {
                let script = self.scratch.join("bench.bt");
                fs::write(&script, self.bpftrace_script())?;
                let mut line = workload.display().to_string();
                for a in args {
                    line.push(' ');
                    line.push_str(a);
                }
                let mut c = Command::new("bpftrace");
                c.arg("-o")
                    .arg(self.scratch.join("bpftrace.out"))
                    .arg(&script)
                    .arg("-c")
                    .arg(line);
                c
            }
            Config::Floor | Config::Memscope | Config::FloorEntry | Config::MemscopeEntry => {
                let mut c = Command::new(&self.tracer);
                c.arg(format!("--output={}", out_dir.display()))
                    .arg("--")
                    .arg(&workload)
                    .args(args);
                if matches!(config, Config::Floor | Config::FloorEntry) {
                    c.env("MEMSCOPE_BPF_NOOP_PROGRAMS", "1");
                }
                if matches!(config, Config::FloorEntry | Config::MemscopeEntry) {
                    c.env("MEMSCOPE_BPF_PLACEMENT", "entry");
                }
                c
            }
        };
        self.exec(c)
    }

    fn have_bpftrace(&self) -> bool {
        cmd::probe(Command::new("bpftrace").arg("--version")).is_some()
    }
}

/// (events, lost) from the tracer's closing lines.
fn tracer_totals(stderr: &str) -> (u64, u64) {
    for line in stderr.lines().rev() {
        let l = line.trim_start_matches("[memscope-bpf] ");
        if let Some(n) = l.strip_suffix(" events, none lost") {
            return (n.trim().parse().unwrap_or(0), 0);
        }
        if let Some(rest) = l.strip_prefix("warning: ")
            && let Some((n, _)) = rest.split_once(" event(s) lost")
        {
            let events = stderr
                .lines()
                .find_map(|x| {
                    x.split(": ")
                        .nth(1)?
                        .split(" events so far")
                        .next()?
                        .parse()
                        .ok()
                })
                .unwrap_or(0);
            return (events, n.trim().parse().unwrap_or(0));
        }
    }
    (0, 0)
}

/// The largest ELF shared object (by file size) under the library dirs and rustup toolchains.
fn largest_shared_object() -> Option<(PathBuf, u64)> {
    largest_shared_objects(1).into_iter().next()
}

/// The `n` largest 64-bit little-endian ELF shared objects on the machine (system and Rust
/// toolchain libraries), largest first.
fn largest_shared_objects(n: usize) -> Vec<(PathBuf, u64)> {
    let mut roots: Vec<PathBuf> = ["/usr/lib", "/usr/lib64", "/usr/local/lib"]
        .iter()
        .map(PathBuf::from)
        .collect();
    let rustup = std::env::var_os("RUSTUP_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".rustup")));
    if let Some(r) = rustup {
        roots.push(r.join("toolchains"));
    }
    let mut found: Vec<(u64, PathBuf)> = Vec::new();
    let mut todo: Vec<(PathBuf, usize)> = roots.into_iter().map(|r| (r, 0)).collect();
    while let Some((d, depth)) = todo.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(meta) = e.path().symlink_metadata() else {
                continue;
            };
            let p = e.path();
            if meta.is_dir() && depth < 10 {
                todo.push((p, depth + 1));
            } else if meta.is_file() {
                let name = e.file_name();
                let name = name.to_string_lossy();
                if name.ends_with(".so") || name.contains(".so.") {
                    found.push((meta.len(), p));
                }
            }
        }
    }
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    found
        .into_iter()
        .filter_map(|(size, p)| {
            let mut head = [0u8; 18];
            let mut f = fs::File::open(&p).ok()?;
            std::io::Read::read_exact(&mut f, &mut head).ok()?;
            // ELF, 64-bit, little-endian, ET_DYN.
            (head.starts_with(b"\x7fELF\x02\x01") && head[16] == 3).then_some((p, size))
        })
        .take(n)
        .collect()
}
