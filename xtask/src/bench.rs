//! `cargo xtask bench`: the benchmark suite, side by side, several rounds each. Writes
//! `docs/benchmarks.md` (tables: median and spread, machine, kernel, date) and the raw
//! numbers (`docs/benchmarks/raw.csv`, `docs/benchmarks/results.json`).
//!
//! Sections (each can be picked with `--only NAME`):
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
//! * `symbols`: `symbols/examples/symbolize_bench.rs`: warm symbolization rate (addresses/s),
//!   unwinding rate (stacks/s), and the cold start on the largest shared object on the machine.
//! * `agent`: the node agent's overhead on the HAL loop and its CPU use at a given event rate
//!   (`bench/agent.rs`).
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
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result, bail};

use crate::{cmd, setup};

mod agent;
mod harm;

const TAG: &str = "[bench]";

const SECTIONS: [&str; 10] = [
    "harm",
    "insn",
    "overhead",
    "stacks",
    "placement",
    "loss",
    "symbols",
    "replay",
    "report",
    "agent",
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
    let (w_stacks, w_syms, w_report, w_harm, w_agent) = (
        want("stacks"),
        want("symbols"),
        want("report"),
        want("harm"),
        want("agent"),
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

    fn insn(&mut self) -> Result<()> {
        println!("{TAG} uprobe cost by first instruction");
        let tracing = Path::new("/sys/kernel/tracing");
        if !tracing.join("uprobe_events").exists() {
            let _ = Command::new("mount")
                .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
                .status();
        }
        let exe = self.bin.join("insn_cost");
        let names = cmd::output(Command::new(&exe).arg("--list"))?;
        let nm = cmd::output(Command::new("nm").arg(&exe))?;
        let iters = if self.opts.quick { "5000" } else { "20000" };
        let rounds = self.opts.rounds.min(3);
        let _ = fs::write(tracing.join("tracing_on"), "0");
        let mut rows = Vec::new();
        for name in names.lines() {
            let Some(addr) = nm
                .lines()
                .find(|l| l.split_whitespace().nth(2) == Some(name))
                .and_then(|l| u64::from_str_radix(l.split_whitespace().next()?, 16).ok())
            else {
                continue;
            };
            // PIE with the text segment mapped at its file offset (checked by the Makefile's
            // plain link): the symbol value is the file offset.
            let event = format!("msbench_{name}");
            let def = format!("p:msbench/{event} {}:{addr:#x}\n", exe.display());
            let run = |probe: bool| -> Result<f64> {
                if probe {
                    fs::OpenOptions::new()
                        .append(true)
                        .open(tracing.join("uprobe_events"))
                        .and_then(|mut f| std::io::Write::write_all(&mut f, def.as_bytes()))
                        .context("defining a tracefs uprobe")?;
                    fs::write(tracing.join(format!("events/msbench/{event}/enable")), "1")?;
                }
                let out = cmd::output(Command::new(&exe).args([name, iters]));
                if probe {
                    let _ = fs::write(tracing.join(format!("events/msbench/{event}/enable")), "0");
                    let _ = fs::OpenOptions::new()
                        .append(true)
                        .open(tracing.join("uprobe_events"))
                        .and_then(|mut f| {
                            std::io::Write::write_all(
                                &mut f,
                                format!("-:msbench/{event}\n").as_bytes(),
                            )
                        });
                }
                Ok(out?.trim().parse()?)
            };
            for round in 0..rounds {
                let base = run(false)?;
                let probed = run(true)?;
                self.sample("insn", name, "untraced", round, "ns_per_call", base);
                self.sample("insn", name, "uprobe", round, "ns_per_call", probed);
                self.sample("insn", name, "uprobe", round, "cost_ns", probed - base);
            }
            rows.push(name.to_string());
        }
        let nop = median(&self.values("insn", "ins_nop", "uprobe", "cost_ns"));
        let mut md = String::new();
        writeln!(
            md,
            "## Uprobe cost by the probed function's first instruction\n"
        )?;
        writeln!(
            md,
            "`tests/fixtures/bench/uprobe_insns.S`: one function per instruction form, called \
             {iters} times in a loop, untraced and with a tracefs uprobe on its first instruction \
             ({rounds} rounds, median). Class: *refused* when the probe never traps (the kernel \
             declined to install it), *emulated* when the cost is under 3x that of `nop` (run \
             in the trap handler), else *single-stepped* (executed out of line, second trap).\n"
        )?;
        writeln!(
            md,
            "| function | first instruction | untraced ns/call | uprobe ns/call | uprobe cost ns (min-max) | class |"
        )?;
        writeln!(md, "|---|---|---:|---:|---:|---|")?;
        for name in &rows {
            let base = median(&self.values("insn", name, "untraced", "ns_per_call"));
            let probed = median(&self.values("insn", name, "uprobe", "ns_per_call"));
            let costs = self.values("insn", name, "uprobe", "cost_ns");
            let cost = median(&costs);
            let (lo, hi) = spread(&costs);
            let class = if cost < 200.0 {
                "refused"
            } else if cost < 3.0 * nop {
                "emulated"
            } else {
                "single-stepped"
            };
            writeln!(
                md,
                "| `{name}` | {} | {} | {} | {} ({}-{}) | {class} |",
                insn_text(name),
                fmt_ns(base),
                fmt_ns(probed),
                fmt_ns(cost),
                fmt_ns(lo),
                fmt_ns(hi)
            )?;
        }
        self.md.push_str(&md);
        self.md.push('\n');
        Ok(())
    }

    fn overhead(&mut self) -> Result<()> {
        println!("{TAG} target overhead");
        let bpftrace = self.have_bpftrace();
        if !bpftrace {
            self.notes.push(
                "(d) bpftrace skipped: `bpftrace` is not installed (apt-get install -y bpftrace)"
                    .into(),
            );
        }
        let (tight_iters, work_iters) = if self.opts.quick {
            (5_000, 3_000)
        } else {
            (30_000, 15_000)
        };
        let workloads: Vec<(&str, Vec<String>)> = vec![
            (
                "tight",
                vec![
                    "--mode".into(),
                    "hal".into(),
                    "--iters".into(),
                    tight_iters.to_string(),
                ],
            ),
            (
                "work",
                vec![
                    "--mode".into(),
                    "hal".into(),
                    "--iters".into(),
                    work_iters.to_string(),
                    "--work".into(),
                    "2".into(),
                ],
            ),
        ];
        let mut configs = vec![
            Config::Untraced,
            Config::Floor,
            Config::Memscope,
            Config::FloorEntry,
            Config::MemscopeEntry,
            Config::Preload,
        ];
        if bpftrace {
            configs.insert(5, Config::Bpftrace);
        }
        for round in 0..self.opts.rounds {
            for (w, args) in &workloads {
                // Side by side: every configuration once per round, in turn.
                for &c in &configs {
                    let out = self.run_workload(c, args)?;
                    let ns = result_field(&out.stdout, "ns_per_call").with_context(|| {
                        format!("no RESULT from {w} under {}:\n{}", c.key(), out.stderr)
                    })?;
                    println!(
                        "{TAG}   round {round} {w:6} {:40} {ns:>9.1} ns/call",
                        c.name()
                    );
                    self.sample("overhead", w, c.key(), round, "ns_per_call", ns);
                }
            }
        }
        let interleaved_md = self.interleaved()?;
        let mut md = String::new();
        writeln!(md, "## Target overhead\n")?;
        writeln!(
            md,
            "`bench_loop --mode hal`: `halMemAlloc` (4 KiB, device 0) + `halMemFree` per \
             iteration, each a traced call with entry and return probes; *tight*: \
             {tight_iters} iterations back to back; *work*: {work_iters} iterations with \
             host work (2 passes over a 4 KiB buffer) after each call. One thread; ns per \
             traced call = loop wall time / calls; overhead = minus (a). {} rounds, configurations \
             interleaved; median (min-max).\n",
            self.opts.rounds
        )?;
        for (w, _) in &workloads {
            let base = median(&self.values("overhead", w, "untraced", "ns_per_call"));
            writeln!(md, "### {w}\n")?;
            writeln!(
                md,
                "| configuration | ns per traced call (min-max) | overhead ns/call | overhead / floor's |"
            )?;
            writeln!(md, "|---|---:|---:|---:|")?;
            let floor = median(&self.values("overhead", w, "floor", "ns_per_call")) - base;
            for &c in &configs {
                let v = self.values("overhead", w, c.key(), "ns_per_call");
                let m = median(&v);
                let (lo, hi) = spread(&v);
                let over = m - base;
                writeln!(
                    md,
                    "| {} | {} ({}-{}) | {} | {} |",
                    c.name(),
                    fmt_ns(m),
                    fmt_ns(lo),
                    fmt_ns(hi),
                    if c == Config::Untraced {
                        "-".into()
                    } else {
                        fmt_ns(over)
                    },
                    if c == Config::Untraced {
                        "-".into()
                    } else {
                        format!("{:.2}", over / floor)
                    }
                )?;
            }
            let mem = median(&self.values("overhead", w, "memscope", "ns_per_call"));
            let flo = median(&self.values("overhead", w, "floor", "ns_per_call"));
            writeln!(
                md,
                "\n(c)/(b): {:.3} on ns per call, {:.3} on overhead (goal ≤ 1.10).{}\n",
                mem / flo,
                (mem - base) / (flo - base),
                if bpftrace {
                    let bt = median(&self.values("overhead", w, "bpftrace", "ns_per_call"));
                    format!(
                        " (c) vs (d) bpftrace: {:.2}x the speed (goal: (c) no slower).",
                        bt / mem
                    )
                } else {
                    String::new()
                }
            )?;
        }
        self.md.push_str(&md);
        self.md.push_str(&interleaved_md);
        Ok(())
    }

    /// (b) and (c) in one process: `bench_loop --mode hal-ab` alternates 256-iteration blocks
    /// between the HAL it links and a copy of it, and the tracer gives the copy the empty
    /// programs (`MEMSCOPE_BPF_NOOP_LIB`). Drifts of the machine (other guests, clock
    /// frequency), which move separate runs by tens of percent here, hit both sides alike.
    fn interleaved(&mut self) -> Result<String> {
        let copy_dir = self.scratch.join("hal-copy");
        fs::create_dir_all(&copy_dir)?;
        let copy = copy_dir.join("libascend_hal.so");
        fs::copy(self.lib.join("libascend_hal.so"), &copy)
            .with_context(|| format!("cannot copy the HAL to {}", copy.display()))?;
        let iters = if self.opts.quick { 50_000 } else { 200_000 };
        let args: Vec<String> = vec![
            "--mode".into(),
            "hal-ab".into(),
            "--copy".into(),
            copy.display().to_string(),
            "--iters".into(),
            iters.to_string(),
        ];
        let workload = self.bin.join("bench_loop");
        let out_dir = self.scratch.join("trace-out");
        for round in 0..self.opts.rounds {
            for traced in [false, true] {
                let _ = fs::remove_dir_all(&out_dir);
                let c = if traced {
                    let mut c = Command::new(&self.tracer);
                    c.arg(format!("--output={}", out_dir.display()))
                        .arg("--")
                        .arg(&workload)
                        .args(&args)
                        .env("MEMSCOPE_BPF_NOOP_LIB", &copy);
                    c
                } else {
                    let mut c = Command::new(&workload);
                    c.args(&args);
                    c
                };
                let out = self.exec(c)?;
                let field = |k: &str| {
                    result_ab_field(&out.stdout, k)
                        .with_context(|| format!("no RESULT_AB from bench_loop:\n{}", out.stderr))
                };
                let (a, b) = (field("a_ns_per_call")?, field("b_ns_per_call")?);
                let key = if traced { "traced" } else { "untraced" };
                println!(
                    "{TAG}   round {round} interleaved {key:8} memscope side {a:>8.1}, floor side {b:>8.1} ns/call, ratio {:.3}",
                    a / b
                );
                self.sample("interleaved", "tight", key, round, "a_ns_per_call", a);
                self.sample("interleaved", "tight", key, round, "b_ns_per_call", b);
                self.sample("interleaved", "tight", key, round, "ratio", a / b);
            }
        }
        let mut md = String::new();
        writeln!(
            md,
            "## Target overhead, (b) and (c) interleaved in one process\n"
        )?;
        writeln!(
            md,
            "`bench_loop --mode hal-ab --iters {iters}`: the tight loop, alternating blocks of 256 \
             iterations between the HAL it links (side A) and a copy of the same file (side B), \
             both called through pointers. Traced, memscope-bpf gives side B the empty programs \
             (`MEMSCOPE_BPF_NOOP_LIB`) and side A its real ones: A is (c), B is (b), measured \
             in the same milliseconds. Untraced, the two sides show what the copy alone costs. \
             {} rounds; median (min-max).\n",
            self.opts.rounds
        )?;
        writeln!(md, "| run | side A ns/call | side B ns/call | A/B |")?;
        writeln!(md, "|---|---:|---:|---:|")?;
        for (key, name) in [
            ("untraced", "untraced"),
            ("traced", "memscope-bpf on A, empty programs on B"),
        ] {
            let cell = |m: &str| {
                let v = self.values("interleaved", "tight", key, m);
                let (lo, hi) = spread(&v);
                if m == "ratio" {
                    format!("{:.3} ({:.3}-{:.3})", median(&v), lo, hi)
                } else {
                    format!("{} ({}-{})", fmt_ns(median(&v)), fmt_ns(lo), fmt_ns(hi))
                }
            };
            writeln!(
                md,
                "| {name} | {} | {} | {} |",
                cell("a_ns_per_call"),
                cell("b_ns_per_call"),
                cell("ratio")
            )?;
        }
        writeln!(md)?;
        Ok(md)
    }

    fn placement(&mut self) -> Result<()> {
        println!("{TAG} probe placement");
        let iters = if self.opts.quick { 3_000 } else { 10_000 };
        let args: Vec<String> = ["--mode", "free", "--iters"]
            .iter()
            .map(|s| s.to_string())
            .chain([iters.to_string()])
            .collect();
        let configs = [
            Config::Untraced,
            Config::FloorEntry,
            Config::Floor,
            Config::MemscopeEntry,
            Config::Memscope,
        ];
        for round in 0..self.opts.rounds {
            for &c in &configs {
                let out = self.run_workload(c, &args)?;
                let ns = result_field(&out.stdout, "ns_per_call").context("no RESULT")?;
                println!(
                    "{TAG}   round {round} free {:40} {ns:>9.1} ns/call",
                    c.name()
                );
                self.sample("placement", "free", c.key(), round, "ns_per_call", ns);
            }
        }
        // Same events under both placements (the e2e test compares rows one by one).
        let hal: Vec<String> = ["--mode", "hal", "--iters", "2000"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut summaries = Vec::new();
        for c in [Config::MemscopeEntry, Config::Memscope] {
            let out = self.run_workload(c, &hal)?;
            let line = out
                .stderr
                .lines()
                .find(|l| l.contains(" rows; "))
                .map(|l| l.split_once(": ").map(|x| x.1).unwrap_or(l).to_string())
                .unwrap_or_else(|| "no rows".into());
            summaries.push((c, line));
        }
        let base = median(&self.values("placement", "free", "untraced", "ns_per_call"));
        let over =
            |c: Config| median(&self.values("placement", "free", c.key(), "ns_per_call")) - base;
        let mut md = String::new();
        writeln!(
            md,
            "## Probe placement: `halMemFree` (first instruction `test %rdi,%rdi`)\n"
        )?;
        writeln!(
            md,
            "`bench_loop --mode free`: {iters} calls of `halMemFree(<unknown address>)` (returns \
             1, so no row is written; the probe cost is what is measured). Naive: entry and \
             return probe at +0 (`test`, single-stepped). Placed: both at +0x3 (`je`, emulated). \
             {} rounds, median (min-max).\n",
            self.opts.rounds
        )?;
        writeln!(
            md,
            "| configuration | ns per call (min-max) | overhead ns/call |"
        )?;
        writeln!(md, "|---|---:|---:|")?;
        for &c in &configs {
            let v = self.values("placement", "free", c.key(), "ns_per_call");
            let (lo, hi) = spread(&v);
            writeln!(
                md,
                "| {} | {} ({}-{}) | {} |",
                c.name()
                    .replace("(b) empty BPF programs (floor)", "(b) floor, placed")
                    .replace("(c) memscope-bpf", "(c) memscope-bpf, placed"),
                fmt_ns(median(&v)),
                fmt_ns(lo),
                fmt_ns(hi),
                if c == Config::Untraced {
                    "-".into()
                } else {
                    fmt_ns(over(c))
                }
            )?;
        }
        writeln!(
            md,
            "\nGain (naive overhead / placed overhead): {:.1}x on the floor, {:.1}x under memscope-bpf (goal ≥ 5x).\n",
            over(Config::FloorEntry) / over(Config::Floor),
            over(Config::MemscopeEntry) / over(Config::Memscope)
        )?;
        writeln!(
            md,
            "Events recorded by `bench_loop --mode hal --iters 2000` (tracer summary):\n"
        )?;
        for (c, s) in &summaries {
            writeln!(md, "- {}: {s}", c.name())?;
        }
        writeln!(md)?;
        for (c, s) in &summaries {
            self.notes
                .push(format!("placement events {}: {s}", c.key()));
        }
        self.md.push_str(&md);
        Ok(())
    }

    fn stacks(&mut self) -> Result<()> {
        println!("{TAG} stack capture cost");
        let iters = if self.opts.quick { 5_000 } else { 30_000 };
        let args: Vec<String> = ["--mode", "hal", "--iters"]
            .iter()
            .map(|s| s.to_string())
            .chain([iters.to_string()])
            .collect();
        // (key, description, stacks on, MEMSCOPE_BPF_STACK_MODE)
        let modes: [(&str, &str, bool, Option<&str>); 3] = [
            ("none", "(c) memscope-bpf, no stacks", false, None),
            (
                "fp",
                "`--call-stack=c:50`, `MEMSCOPE_BPF_STACK_MODE=fp`: kernel frame-pointer walk only",
                true,
                Some("fp"),
            ),
            (
                "full",
                "`--call-stack=c:50` (default): walk + copy of up to 8 KiB of user stack",
                true,
                None,
            ),
        ];
        let out_dir = self.scratch.join("trace-out");
        for round in 0..self.opts.rounds {
            for (key, _, on, env) in modes {
                let _ = fs::remove_dir_all(&out_dir);
                let mut c = Command::new(&self.tracer);
                c.arg(format!("--output={}", out_dir.display()));
                if on {
                    c.arg("--call-stack=c:50");
                }
                match env {
                    Some(m) => c.env("MEMSCOPE_BPF_STACK_MODE", m),
                    None => c.env_remove("MEMSCOPE_BPF_STACK_MODE"),
                };
                c.arg("--").arg(self.bin.join("bench_loop")).args(&args);
                let t = Instant::now();
                let out = self.exec(c)?;
                let wall = t.elapsed().as_secs_f64();
                let ns = result_field(&out.stdout, "ns_per_call")
                    .with_context(|| format!("no RESULT under stacks {key}:\n{}", out.stderr))?;
                let loop_s = result_field(&out.stdout, "elapsed_ns").unwrap_or(f64::NAN) / 1e9;
                let (events, lost) = tracer_totals(&out.stderr);
                let (with_stack, truncated) = csv_stacks(&out_dir);
                println!(
                    "{TAG}   round {round} stacks {key:4} {ns:>9.1} ns/call, tracer {wall:.2} s \
                     (loop {loop_s:.2} s), {events} records, {lost} lost, {with_stack} rows with a stack"
                );
                self.sample("stacks", "tight", key, round, "ns_per_call", ns);
                self.sample("stacks", "tight", key, round, "tracer_wall_s", wall);
                self.sample("stacks", "tight", key, round, "loop_s", loop_s);
                self.sample("stacks", "tight", key, round, "records", events as f64);
                self.sample("stacks", "tight", key, round, "lost", lost as f64);
                self.sample(
                    "stacks",
                    "tight",
                    key,
                    round,
                    "rows_with_stack",
                    with_stack as f64,
                );
                self.sample("stacks", "tight", key, round, "truncated", truncated as f64);
            }
        }
        let _ = fs::remove_dir_all(&out_dir);
        let med = |k: &str, m: &str| median(&self.values("stacks", "tight", k, m));
        let base = med("none", "ns_per_call");
        let mut md = String::new();
        writeln!(md, "## Stack capture cost (`--call-stack=c:50`)\n")?;
        writeln!(
            md,
            "`bench_loop --mode hal --iters {iters}` (the tight loop above, {} traced calls) under \
             memscope-bpf, {} rounds, modes interleaved, median (min-max). ns per traced call is \
             the workload's own timing (its loop), so it is the target's cost. The tracer's wall \
             time covers start-up, the loop and the tail: with stacks on, user space unwinds and \
             symbolizes on a worker thread and rows wait in memory (the reorder buffer) until \
             their stack is resolved, so a tracer that cannot keep up finishes late rather than \
             losing events. Records = ring records (one per call plus, with stacks, one STACK \
             record per call). Rows with a stack are counted in the CSV written; `bench_loop` is \
             built `-O2` without frame pointers, so frame-pointer-only stacks end `[truncated]` \
             (that mode is measured for its cost, not its stacks).\n",
            2 * iters,
            self.opts.rounds
        )?;
        writeln!(
            md,
            "| mode | ns per traced call (min-max) | added over no stacks ns/call | tracer wall s (loop s) | ring records | lost | rows with a stack (truncated) |"
        )?;
        writeln!(md, "|---|---:|---:|---:|---:|---:|---:|")?;
        for (key, desc, _, _) in modes {
            let v = self.values("stacks", "tight", key, "ns_per_call");
            let (lo, hi) = spread(&v);
            let lost = self.values("stacks", "tight", key, "lost");
            writeln!(
                md,
                "| {desc} | {} ({}-{}) | {} | {:.2} ({:.2}) | {} | {:.0} (max {:.0}) | {:.0} ({:.0}) |",
                fmt_ns(median(&v)),
                fmt_ns(lo),
                fmt_ns(hi),
                if key == "none" {
                    "-".into()
                } else {
                    fmt_ns(median(&v) - base)
                },
                med(key, "tracer_wall_s"),
                med(key, "loop_s"),
                // The tracer prints no record total when it lost events.
                if med(key, "records") > 0.0 {
                    format!("{:.0}", med(key, "records"))
                } else {
                    "-".into()
                },
                median(&lost),
                spread(&lost).1,
                med(key, "rows_with_stack"),
                med(key, "truncated"),
            )?;
        }
        let tail = |k: &str| med(k, "tracer_wall_s") - med(k, "loop_s");
        writeln!(
            md,
            "\nTracer time beyond the loop (start-up, attach, drain, symbolization, exit): {:.2} s \
             without stacks, {:.2} s with the frame-pointer walk, {:.2} s with the stack copy.\n",
            tail("none"),
            tail("fp"),
            tail("full")
        )?;
        self.md.push_str(&md);
        Ok(())
    }

    fn symbols(&mut self, target: &Path) -> Result<()> {
        println!("{TAG} symbolization and unwinding");
        let exe = target.join("release/examples/symbolize_bench");
        let secs = if self.opts.quick { "0.5" } else { "1" };
        let rounds = self.opts.rounds.min(3);
        let mut fixtures: Vec<PathBuf> = Vec::new();
        for (dir, pick) in [
            (self.lib.clone(), ".so"),
            (self.bin.clone(), "stack_workload_"),
        ] {
            let mut v: Vec<PathBuf> = fs::read_dir(&dir)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.is_file()
                        && p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.contains(pick))
                })
                .collect();
            v.sort();
            fixtures.extend(v);
        }
        let mut last: BTreeMap<&str, String> = BTreeMap::new();
        for round in 0..rounds {
            let mut runs: Vec<(&'static str, Vec<String>)> = vec![
                (
                    "self",
                    vec![
                        "symbolize".into(),
                        "--self".into(),
                        "--seconds".into(),
                        secs.into(),
                    ],
                ),
                (
                    "unwind",
                    vec!["unwind".into(), "--seconds".into(), secs.into()],
                ),
            ];
            if !fixtures.is_empty() {
                let mut a: Vec<String> = vec!["symbolize".into(), "--seconds".into(), secs.into()];
                a.extend(fixtures.iter().map(|p| p.display().to_string()));
                runs.insert(1, ("fixtures", a));
            }
            for (w, a) in runs {
                let mut c = Command::new(&exe);
                c.args(&a);
                let out = self.exec(c)?;
                let metrics: &[&'static str] = if w == "unwind" {
                    &[
                        "unwind_stacks_per_s",
                        "unwind_frames_per_s",
                        "resolve_stacks_per_s",
                        "dedup_stacks_per_s",
                    ]
                } else {
                    &["addr_per_s", "frames_per_s", "warmup_ms"]
                };
                for &m in metrics {
                    let v = result_field(&out.stdout, m).unwrap_or(f64::NAN);
                    self.sample("symbols", w, "warm", round, m, v);
                }
                let line = out
                    .stdout
                    .lines()
                    .find(|l| l.starts_with("RESULT "))
                    .unwrap_or("")
                    .to_string();
                println!("{TAG}   round {round} {w}: {line}");
                last.insert(w, line);
            }
        }
        let field = |w: &str, k: &str| {
            last.get(w)
                .and_then(|l| {
                    l.split_whitespace()
                        .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                })
                .unwrap_or("?")
                .to_string()
        };
        let mut md = String::new();
        writeln!(md, "## Symbolization and unwinding (user space)\n")?;
        writeln!(
            md,
            "`symbols/examples/symbolize_bench.rs` (`memscope_symbols` only, one thread, {rounds} \
             rounds of {secs} s, median (min-max)). Warm: after one pass over every address (each \
             object parsed, DWARF loaded), the same addresses again in a fixed shuffled order; \
             a frame is one output line (inlined functions add frames).\n"
        )?;
        writeln!(
            md,
            "| address set | addresses | with a source line | frames/address | first pass ms | warm addresses/s (min-max) | warm frames/s |"
        )?;
        writeln!(md, "|---|---:|---:|---:|---:|---:|---:|")?;
        for (w, desc) in [
            (
                "self",
                "every function of the bench process (Rust binary without DWARF, libc with its separate debug file, ld.so, libgcc_s), real maps",
            ),
            (
                "fixtures",
                "every function of the fixture libraries and stack workloads (C/C++, `-O2 -g`), mapped in a synthetic view",
            ),
        ] {
            let v = self.values("symbols", w, "warm", "addr_per_s");
            if v.is_empty() {
                continue;
            }
            let (lo, hi) = spread(&v);
            writeln!(
                md,
                "| {desc} | {} | {} | {} | {:.1} | {:.2} M ({:.2}-{:.2}) | {:.2} M |",
                field(w, "addresses"),
                field(w, "with_line"),
                field(w, "frames_per_address"),
                median(&self.values("symbols", w, "warm", "warmup_ms")),
                median(&v) / 1e6,
                lo / 1e6,
                hi / 1e6,
                median(&self.values("symbols", w, "warm", "frames_per_s")) / 1e6,
            )?;
        }
        let u = self.values("symbols", "unwind", "warm", "unwind_stacks_per_s");
        let r = self.values("symbols", "unwind", "warm", "resolve_stacks_per_s");
        let ((ulo, uhi), (rlo, rhi)) = (spread(&u), spread(&r));
        writeln!(
            md,
            "\nUnwinding (CFI, `memscope_symbols::unwind`) of one captured stack of the bench \
             process ({} frames, {} bytes of stack copied like BPF's copy, stop: {}, outermost \
             `{}`): {:.0} stacks/s ({:.0}-{:.0}), {:.2} M frames/s; unwind + symbolize every \
             frame (what the tracer's worker does per stack, minus formatting): {:.0} stacks/s \
             ({:.0}-{:.0}).\n",
            field("unwind", "depth"),
            field("unwind", "stack_bytes"),
            field("unwind", "stop"),
            field("unwind", "outermost"),
            median(&u),
            ulo,
            uhi,
            median(&self.values("symbols", "unwind", "warm", "unwind_frames_per_s")) / 1e6,
            median(&r),
            rlo,
            rhi,
        )?;
        let d = self.values("symbols", "unwind", "warm", "dedup_stacks_per_s");
        if d.iter().any(|v| v.is_finite()) {
            let (dlo, dhi) = spread(&d);
            writeln!(
                md,
                "What the tracer's stack worker does per stack (unwind with the unwind rules of \
                 each code address computed once per process, then the text of a stack already \
                 seen taken from a table; a new stack is symbolized once per address and \
                 formatted once): {:.0} stacks/s ({:.0}-{:.0}). Target (issue 14): 300k stacks/s \
                 on one core; this machine is shared, so rates here are wall-clock rates of a \
                 thread that may not have had its core to itself.\n",
                median(&d),
                dlo,
                dhi,
            )?;
        }
        // Cold start on the largest shared object.
        match largest_shared_object() {
            None => self
                .notes
                .push("cold start skipped: no shared object found".into()),
            Some((path, size)) => {
                println!("{TAG}   cold start: {} ({size} bytes)", path.display());
                let mut last = String::new();
                for round in 0..rounds {
                    for cache in ["dropped", "cached"] {
                        if cache == "dropped" {
                            // posix_fadvise(DONTNEED) on this file only; pages mapped by
                            // running processes stay resident.
                            let _ = cmd::probe(Command::new("dd").args([
                                &format!("if={}", path.display()),
                                "iflag=nocache",
                                "count=0",
                                "status=none",
                            ]));
                        }
                        let resident = cmd::probe(
                            Command::new("fincore")
                                .args(["--bytes", "--noheadings", "--output", "RES"])
                                .arg(&path),
                        )
                        .and_then(|s| s.trim().parse::<f64>().ok())
                        .unwrap_or(f64::NAN);
                        let mut c = Command::new(&exe);
                        c.arg("cold").arg(&path);
                        let out = self.exec(c)?;
                        for m in [
                            "total_ms",
                            "parse_ms",
                            "first_symbolize_ms",
                            "cfi_index_ms",
                            "second_symbolize_us",
                            "peak_rss_kib",
                        ] {
                            let v = result_field(&out.stdout, m).unwrap_or(f64::NAN);
                            self.sample("symbols", "cold", cache, round, m, v);
                        }
                        self.sample("symbols", "cold", cache, round, "resident_bytes", resident);
                        last = out
                            .stdout
                            .lines()
                            .find(|l| l.starts_with("RESULT "))
                            .unwrap_or("")
                            .to_string();
                        println!("{TAG}   round {round} cold ({cache} page cache): {last}");
                    }
                }
                let f = |k: &str| {
                    last.split_whitespace()
                        .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                        .unwrap_or("?")
                        .to_string()
                };
                writeln!(
                    md,
                    "Cold start on the largest ELF shared object under /usr/lib, /usr/lib64, \
                     /usr/local/lib and the rustup toolchains: `{}`, {size} bytes ({:.1} MiB), \
                     {} symbols, DWARF: {}, {} FDEs. A fresh `Symbolizer` and a view mapping the \
                     file, then: parse (symbol tables, segments, CFI sections), the first \
                     `symbolize` of an address in the middle of `.text` (loads DWARF when there \
                     is any; resolved to `{}`), and the CFI index (`fde_count`). *dropped*: the \
                     file's page cache evicted first with `dd iflag=nocache` (best effort: pages \
                     mapped by running processes stay; residency before the run shown); \
                     *cached*: run again right after. {rounds} rounds, median (min-max).\n",
                    path.display(),
                    size as f64 / (1 << 20) as f64,
                    f("symbols"),
                    f("has_dwarf"),
                    f("fdes"),
                    f("function").replace('_', " "),
                )?;
                writeln!(
                    md,
                    "| page cache | resident before MiB | total ms (min-max) | parse ms | first symbolize ms | CFI index ms | next address µs | peak RSS KiB |"
                )?;
                writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|")?;
                for cache in ["dropped", "cached"] {
                    let g = |m: &str| median(&self.values("symbols", "cold", cache, m));
                    let (lo, hi) = spread(&self.values("symbols", "cold", cache, "total_ms"));
                    writeln!(
                        md,
                        "| {cache} | {:.1} | {:.0} ({:.0}-{:.0}) | {:.0} | {:.1} | {:.1} | {:.1} | {:.0} |",
                        g("resident_bytes") / (1 << 20) as f64,
                        g("total_ms"),
                        lo,
                        hi,
                        g("parse_ms"),
                        g("first_symbolize_ms"),
                        g("cfi_index_ms"),
                        g("second_symbolize_us"),
                        g("peak_rss_kib"),
                    )?;
                }
                writeln!(md)?;
                self.notes.push(format!(
                    "cold start file: {} ({size} bytes)",
                    path.display()
                ));
            }
        }
        self.md.push_str(&md);
        Ok(())
    }

    fn loss(&mut self) -> Result<()> {
        println!("{TAG} no loss under load ({} s)", self.opts.loss_seconds);
        let mut md = String::new();
        writeln!(md, "## No loss under load\n")?;
        writeln!(
            md,
            "`bench_loop --threads 4 --seconds {}` under memscope-bpf with the default ring \
             buffer, on this {}-CPU machine (the 4 workload threads and the tracer share the \
             CPUs). Events = completed traced calls (HAL calls reach user space in per-CPU batches of packed calls, about 100 `halMemAlloc`/`halMemFree` calls per 4 KiB record; mstx marks one ring record each).\n",
            self.opts.loss_seconds,
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(0)
        )?;
        writeln!(
            md,
            "| workload | traced calls | calls/s held | rows written by the tracer | lost (ring full + in flight) |"
        )?;
        writeln!(md, "|---|---:|---:|---:|---:|")?;
        for (mode, secs) in [
            ("hal", self.opts.loss_seconds),
            ("mstx", self.opts.loss_seconds.div_ceil(6)),
        ] {
            let args: Vec<String> = vec![
                "--mode".into(),
                mode.into(),
                "--threads".into(),
                "4".into(),
                "--seconds".into(),
                secs.to_string(),
            ];
            let out = self.run_workload(Config::Memscope, &args)?;
            let calls = result_field(&out.stdout, "calls").unwrap_or(f64::NAN);
            let elapsed = result_field(&out.stdout, "elapsed_ns").unwrap_or(f64::NAN) / 1e9;
            let (_, lost) = tracer_totals(&out.stderr);
            // Rows written = completed calls recorded (every call here succeeds: one row each).
            let events: u64 = out
                .stderr
                .lines()
                .find_map(|l| {
                    l.split(": ")
                        .nth(1)?
                        .strip_suffix(" rows")
                        .or_else(|| l.split(": ").nth(1)?.split(" rows;").next())?
                        .parse()
                        .ok()
                })
                .unwrap_or(0);
            let rate = calls / elapsed;
            println!(
                "{TAG}   {mode}: {calls} calls in {elapsed:.1} s ({rate:.0}/s), tracer: {events} events, {lost} lost"
            );
            self.sample("loss", mode, "memscope", 0, "calls", calls);
            self.sample("loss", mode, "memscope", 0, "calls_per_s", rate);
            self.sample("loss", mode, "memscope", 0, "events", events as f64);
            self.sample("loss", mode, "memscope", 0, "lost", lost as f64);
            writeln!(
                md,
                "| {mode}, 4 threads, {secs} s | {calls:.0} | {rate:.0} | {events} | {lost} |"
            )?;
        }
        writeln!(md)?;
        self.md.push_str(&md);
        Ok(())
    }

    fn replay(&mut self, target: &Path) -> Result<()> {
        println!("{TAG} user-space throughput ({} events)", self.opts.events);
        let exe = target.join("release/examples/replay");
        let out_dir = self.scratch.join("replay-out");
        let rounds = self.opts.rounds.min(3);
        let runs: Vec<(String, u64)> = vec![
            ("none".into(), self.opts.events),
            ("csv".into(), self.opts.events),
            ("csv".into(), self.opts.events / 10),
        ];
        let mut md = String::new();
        writeln!(md, "## User-space throughput\n")?;
        writeln!(
            md,
            "`probe-user/examples/replay.rs`: synthetic ring records (halMemAlloc/halMemFree \
             pairs over 8 threads, 64 live blocks per thread, every 1000th block leaked), packed \
             into batch records as the BPF side sends them, through `decode::batch_calls` + \
             `decode::decode`, `tracker::ProcessState::apply_into`, the \
             writer, then the leak analysis (leak files + report). One core, {rounds} rounds, \
             median (min-max). Peak RSS is VmHWM of the whole process. The `db` writer does not \
             exist yet (`--format=db` is refused), so it is not measured.\n"
        )?;
        writeln!(
            md,
            "| writer | events | events/s (min-max) | peak RSS KiB | live blocks at end |"
        )?;
        writeln!(md, "|---|---:|---:|---:|---:|")?;
        for (writer, events) in runs {
            let workload = format!("{writer}-{events}");
            let mut live = 0.0;
            let mut rss = 0.0;
            for round in 0..rounds {
                let _ = fs::remove_dir_all(&out_dir);
                let mut c = Command::new(&exe);
                c.args([
                    "--events",
                    &events.to_string(),
                    "--writer",
                    &writer,
                    "--out",
                ])
                .arg(&out_dir);
                let out = self.exec(c)?;
                let get = |k: &str| -> f64 {
                    out.stdout
                        .split(&format!("\"{k}\":"))
                        .nth(1)
                        .and_then(|r| r.split([',', '}']).next())
                        .and_then(|v| v.trim_matches('"').parse().ok())
                        .unwrap_or(f64::NAN)
                };
                let eps = get("events_per_s");
                rss = get("peak_rss_kib");
                live = get("live_blocks");
                println!("{TAG}   {writer} {events}: {eps:.0} events/s, peak RSS {rss} KiB");
                self.sample("replay", &workload, &writer, round, "events_per_s", eps);
                self.sample("replay", &workload, &writer, round, "peak_rss_kib", rss);
            }
            let _ = fs::remove_dir_all(&out_dir);
            let v = self.values("replay", &workload, &writer, "events_per_s");
            let (lo, hi) = spread(&v);
            writeln!(
                md,
                "| {writer} | {events} | {:.2} M ({:.2}-{:.2}) | {rss:.0} | {live:.0} |",
                median(&v) / 1e6,
                lo / 1e6,
                hi / 1e6
            )?;
        }
        writeln!(
            md,
            "\nGoal: ≥ 2 M events/s for decoding + leak analysis + CSV on one core; RSS flat in the number of events.\n"
        )?;
        self.md.push_str(&md);
        Ok(())
    }

    /// `report`: a 10 M-event dump drawn as HTML; build time, size, first paint.
    fn report(&mut self, target: &Path) -> Result<()> {
        let events = self.opts.events;
        println!("{TAG} HTML report of a {events}-event dump");
        let dump_dir = self.scratch.join("report-dump");
        let _ = fs::remove_dir_all(&dump_dir);
        let mut c = Command::new(target.join("release/examples/replay"));
        c.args(["--events", &events.to_string(), "--writer", "csv", "--out"])
            .arg(&dump_dir);
        self.exec(c)?;
        let dump_bytes: u64 = walk_files(&dump_dir)
            .iter()
            .filter_map(|p| fs::metadata(p).ok())
            .map(|m| m.len())
            .sum();
        let page = self.scratch.join("report-10m.html");
        let rounds = self.opts.rounds.min(3);
        let chrome = ["chromium", "chromium-browser"].into_iter().find(|c| {
            Command::new("which")
                .arg(c)
                .output()
                .is_ok_and(|o| o.status.success())
        });
        for round in 0..rounds {
            let t = Instant::now();
            let mut c = Command::new(target.join("release/memscope-bpf"));
            c.args(["report", "-q", "-i"])
                .arg(&dump_dir)
                .arg("-o")
                .arg(&page);
            self.exec(c)?;
            let build_s = t.elapsed().as_secs_f64();
            let size = fs::metadata(&page)?.len() as f64;
            self.sample("report", "10m", "html", round, "build_s", build_s);
            self.sample("report", "10m", "html", round, "bytes", size);
            let Some(chrome) = chrome else {
                self.notes
                    .push("report: no chromium on PATH, first paint not measured".into());
                continue;
            };
            let profile = self.scratch.join("report-chrome");
            let t = Instant::now();
            let mut c = Command::new(chrome);
            c.args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--window-size=1400,2600",
                "--dump-dom",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(format!("file://{}", page.display()));
            let out = self.exec(c)?;
            let wall_s = t.elapsed().as_secs_f64();
            // The self-check JSON in the DOM: `"first_paint_ms":1234.5`.
            let metric = |k: &str| {
                out.stdout
                    .split(&format!("\"{k}\":"))
                    .nth(1)
                    .and_then(|r| r.split(['}', ',']).next())
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(f64::NAN)
            };
            let paint_ms = metric("first_paint_ms");
            println!(
                "{TAG}   build {build_s:.2} s, {:.2} MiB, first paint {paint_ms:.0} ms (chromium wall {wall_s:.2} s)",
                size / (1 << 20) as f64
            );
            self.sample("report", "10m", "html", round, "first_paint_ms", paint_ms);
            self.sample("report", "10m", "html", round, "chromium_wall_s", wall_s);
        }
        let _ = fs::remove_dir_all(&dump_dir);
        let m = |k: &str| median(&self.values("report", "10m", "html", k));
        let mut md = String::new();
        writeln!(md, "## HTML report of a {events}-event dump\n")?;
        writeln!(
            md,
            "The replay example's CSV dump ({:.0} MiB, {events} events) drawn by \
             `memscope-bpf report` (release), {rounds} rounds, median. First paint: the page's \
             own measure (`performance.now()`), from navigation start until every chart is drawn \
             (HTML parsed, ECharts evaluated; the self-check the tests read); chromium wall: `chromium --headless --dump-dom` from start to exit.\n",
            dump_bytes as f64 / (1 << 20) as f64
        )?;
        writeln!(
            md,
            "| build s | page MiB | first paint ms | chromium wall s |"
        )?;
        writeln!(md, "|---:|---:|---:|---:|")?;
        writeln!(
            md,
            "| {:.2} | {:.2} | {:.0} | {:.2} |",
            m("build_s"),
            m("bytes") / (1 << 20) as f64,
            m("first_paint_ms"),
            m("chromium_wall_s")
        )?;
        writeln!(md, "\nGoal: under 10 MB, first paint under 3 s.\n")?;
        self.md.push_str(&md);
        Ok(())
    }

    /// The issue's goals against this run (and the previous run's results.json, if any).
    fn summary(&self, prev: &str) -> Result<String> {
        let cur = |sec: &str, w: &str, c: &str, m: &str| median(&self.values(sec, w, c, m));
        let old = |sec: &str, w: &str, c: &str, m: &str| {
            let key = format!(
                "\"section\": \"{sec}\", \"workload\": \"{w}\", \"config\": \"{c}\", \"metric\": \"{m}\", \"median\": "
            );
            prev.split(&key)
                .nth(1)
                .and_then(|r| r.split(',').next())
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(f64::NAN)
        };
        let verdict = |ok: bool| if ok { "**met**" } else { "**not met**" };
        let p = |v: f64, f: &dyn Fn(f64) -> String| {
            if v.is_nan() { "-".to_string() } else { f(v) }
        };
        let prev_date = prev
            .split("\"date\": \"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or("none");
        let mut md = String::new();
        writeln!(md, "## Summary: the issue's goals in this run\n")?;
        writeln!(
            md,
            "The *previous* column is the run before this one (results.json of {prev_date}); \
             runs on different days or machine states differ by more than the changes between \
             them, so compare builds side by side instead. Verdicts use this run's medians, \
             unrounded.\n"
        )?;
        writeln!(md, "| goal | this run | previous | verdict |")?;
        writeln!(md, "|---|---|---|---|")?;
        if !self
            .values("overhead", "tight", "memscope", "ns_per_call")
            .is_empty()
        {
            for w in ["tight", "work"] {
                let ratio = |get: &dyn Fn(&str, &str, &str, &str) -> f64| {
                    let (a, b, c) = (
                        get("overhead", w, "untraced", "ns_per_call"),
                        get("overhead", w, "floor", "ns_per_call"),
                        get("overhead", w, "memscope", "ns_per_call"),
                    );
                    (c / b, (c - a) / (b - a))
                };
                let (r, ro) = ratio(&cur);
                let (pr, pro) = ratio(&old);
                writeln!(
                    md,
                    "| (c)/(b) ≤ 1.10, {w} loop | {r:.3} on ns per call, {ro:.3} on overhead | {} | {} |",
                    p(pr, &|v| format!("{v:.3} / {pro:.3}")),
                    if r <= 1.10 && ro <= 1.10 {
                        verdict(true).to_string()
                    } else if r <= 1.10 {
                        "**met on ns per call, not on overhead**".to_string()
                    } else {
                        verdict(false).to_string()
                    }
                )?;
            }
            if !self
                .values("interleaved", "tight", "traced", "ratio")
                .is_empty()
            {
                let r = cur("interleaved", "tight", "traced", "ratio");
                let pr = old("interleaved", "tight", "traced", "ratio");
                writeln!(
                    md,
                    "| (c)/(b) ≤ 1.10, tight loop, (b) and (c) interleaved in one process | {r:.3} (over the floor: {} ns/call) | {} | {} |",
                    fmt_ns(
                        cur("interleaved", "tight", "traced", "a_ns_per_call")
                            - cur("interleaved", "tight", "traced", "b_ns_per_call")
                    ),
                    p(pr, &|v| format!("{v:.3}")),
                    verdict(r <= 1.10)
                )?;
            }
            if !self
                .values("overhead", "tight", "bpftrace", "ns_per_call")
                .is_empty()
            {
                for w in ["tight", "work"] {
                    let (m, bt) = (
                        cur("overhead", w, "memscope", "ns_per_call"),
                        cur("overhead", w, "bpftrace", "ns_per_call"),
                    );
                    let (pm, pbt) = (
                        old("overhead", w, "memscope", "ns_per_call"),
                        old("overhead", w, "bpftrace", "ns_per_call"),
                    );
                    writeln!(
                        md,
                        "| (c) no slower than bpftrace, {w} loop | {} vs {} ns per call ({:.2}x bpftrace's speed) | {} | {} |",
                        fmt_ns(m),
                        fmt_ns(bt),
                        bt / m,
                        p(pm, &|v| format!("{} vs {} ns", fmt_ns(v), fmt_ns(pbt))),
                        verdict(m <= bt)
                    )?;
                }
            }
        }
        if !self
            .values("placement", "free", "memscope", "ns_per_call")
            .is_empty()
        {
            let gains = |get: &dyn Fn(&str, &str, &str, &str) -> f64| {
                let base = get("placement", "free", "untraced", "ns_per_call");
                let o = |c: &str| get("placement", "free", c, "ns_per_call") - base;
                (
                    o("floor_entry") / o("floor"),
                    o("memscope_entry") / o("memscope"),
                )
            };
            let (gf, gm) = gains(&cur);
            let (pgf, pgm) = gains(&old);
            writeln!(
                md,
                "| placement ≥ 5x less overhead than naive on `halMemFree` | {gm:.2}x under memscope-bpf, {gf:.2}x on the floor | {} | {} |",
                p(pgm, &|v| format!("{v:.2}x / {pgf:.2}x")),
                if gm >= 5.0 && gf >= 5.0 {
                    verdict(true).to_string()
                } else if gf >= 5.0 {
                    "**met on the floor only, not under memscope-bpf**".to_string()
                } else if gm >= 5.0 {
                    "**met under memscope-bpf only, not on the floor**".to_string()
                } else {
                    verdict(false).to_string()
                }
            )?;
        }
        let w = format!("csv-{}", self.opts.events);
        if !self.values("replay", &w, "csv", "events_per_s").is_empty() {
            let e = cur("replay", &w, "csv", "events_per_s");
            let pe = old("replay", &w, "csv", "events_per_s");
            writeln!(
                md,
                "| ≥ 2 M events/s decode + leaks + CSV (one core, {} events) | {:.2} M/s | {} | {} |",
                self.opts.events,
                e / 1e6,
                p(pe, &|v| format!("{:.2} M/s", v / 1e6)),
                verdict(e >= 2e6)
            )?;
        }
        if !self.values("loss", "hal", "memscope", "lost").is_empty() {
            let l = cur("loss", "hal", "memscope", "lost");
            let lm = cur("loss", "mstx", "memscope", "lost");
            writeln!(
                md,
                "| 0 loss, {} s 4-thread run | {l:.0} lost of {:.0} (hal), {lm:.0} lost (mstx) | {} | {} |",
                self.opts.loss_seconds,
                cur("loss", "hal", "memscope", "calls"),
                p(old("loss", "hal", "memscope", "lost"), &|v| format!(
                    "{v:.0} lost of {:.0}",
                    old("loss", "hal", "memscope", "calls")
                )),
                verdict(l == 0.0 && lm == 0.0)
            )?;
        }
        if !self
            .values("stacks", "tight", "none", "ns_per_call")
            .is_empty()
        {
            let base = cur("stacks", "tight", "none", "ns_per_call");
            let lost = self.values("stacks", "tight", "full", "lost");
            let lost_fp = self.values("stacks", "tight", "fp", "lost");
            writeln!(
                md,
                "| (no goal) stack capture, tight loop | +{} ns/call frame-pointer walk, +{} ns/call walk + stack copy; lost: {:.0} / {:.0} (max over rounds) | - | - |",
                fmt_ns(cur("stacks", "tight", "fp", "ns_per_call") - base),
                fmt_ns(cur("stacks", "tight", "full", "ns_per_call") - base),
                spread(&lost_fp).1,
                spread(&lost).1,
            )?;
        }
        writeln!(md)?;
        Ok(md)
    }

    fn write(&mut self, seconds: f64) -> Result<()> {
        let docs = self.repo.join("docs");
        let raw_dir = docs.join("benchmarks");
        fs::create_dir_all(&raw_dir)?;
        let mut csv = String::from("section,workload,config,round,metric,value\n");
        for s in &self.samples {
            writeln!(
                csv,
                "{},{},{},{},{},{}",
                s.section, s.workload, s.config, s.round, s.metric, s.value
            )?;
        }
        let machine = machine_info();
        // results.json: medians per (section, workload, config, metric), plus the machine.
        let mut groups: BTreeMap<(String, String, String, String), Vec<f64>> = BTreeMap::new();
        for s in &self.samples {
            groups
                .entry((
                    s.section.into(),
                    s.workload.clone(),
                    s.config.clone(),
                    s.metric.into(),
                ))
                .or_default()
                .push(s.value);
        }
        let mut json = String::from("{\n  \"machine\": {");
        let m: Vec<String> = machine
            .iter()
            .map(|(k, v)| format!("\"{k}\": \"{}\"", v.replace('"', "'")))
            .collect();
        json.push_str(&m.join(", "));
        json.push_str("},\n  \"results\": [\n");
        let rows: Vec<String> = groups
            .iter()
            .map(|((sec, w, c, met), v)| {
                let (lo, hi) = spread(v);
                format!(
                    "    {{\"section\": \"{sec}\", \"workload\": \"{w}\", \"config\": \"{c}\", \"metric\": \"{met}\", \"median\": {}, \"min\": {lo}, \"max\": {hi}, \"n\": {}}}",
                    median(v),
                    v.len()
                )
            })
            .collect();
        json.push_str(&rows.join(",\n"));
        json.push_str("\n  ]\n}\n");
        let suffix = if self.opts.write_docs { "" } else { "-partial" };
        let prev = fs::read_to_string(raw_dir.join("results.json")).unwrap_or_default();
        let summary = self.summary(&prev)?;
        fs::write(raw_dir.join(format!("raw{suffix}.csv")), csv)?;
        fs::write(raw_dir.join(format!("results{suffix}.json")), json)?;
        let mut md = String::from("# Benchmarks\n\nWritten by `cargo xtask bench`");
        if self.opts.quick {
            md.push_str(" --quick");
        }
        writeln!(
            md,
            " in {seconds:.0} s. Raw numbers: [benchmarks/raw.csv](benchmarks/raw.csv), \
             medians: [benchmarks/results.json](benchmarks/results.json). Times are for this \
             machine only; compare configurations within one run. Side-by-side comparisons of \
             builds and what changed between runs, written by hand: \
             [benchmark-notes.md](benchmark-notes.md).\n"
        )?;
        writeln!(md, "| | |\n|---|---|")?;
        for (k, v) in &machine {
            writeln!(md, "| {k} | {v} |")?;
        }
        writeln!(md)?;
        md.push_str(&summary);
        md.push_str(&self.md);
        if !self.notes.is_empty() {
            writeln!(md, "## Notes\n")?;
            for n in &self.notes {
                writeln!(md, "- {n}")?;
            }
        }
        let path = docs.join(format!("benchmarks{suffix}.md"));
        fs::write(&path, md)?;
        println!("{TAG} wrote {}", path.display());
        Ok(())
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

/// (rows with a C stack, rows whose stack is truncated) in the CSV files under `dir`.
fn csv_stacks(dir: &Path) -> (u64, u64) {
    let mut files = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "csv") {
                files.push(p);
            }
        }
    }
    let (mut with, mut truncated) = (0, 0);
    for f in files {
        let Ok(text) = fs::read_to_string(&f) else {
            continue;
        };
        // The C stack is the last column, after the (empty) Python stack.
        with += (text.matches(",,\"0x").count() + text.matches(",,0x").count()) as u64;
        with += text.matches(",,[truncated]").count() as u64;
        truncated += text.matches("[truncated]").count() as u64;
    }
    (with, truncated)
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

fn insn_text(name: &str) -> &'static str {
    match name {
        "ins_nop" => "`nop` (90)",
        "ins_nop2" => "`xchg %ax,%ax` (66 90)",
        "ins_nop3" => "`nopl (%rax)` (0f 1f 00)",
        "ins_nop4" => "`nopl 0(%rax)` (0f 1f 40 00)",
        "ins_nop5" => "`nopl 0(%rax,%rax,1)` (0f 1f 44 00 00)",
        "ins_endbr64" => "`endbr64`",
        "ins_push_rbp" => "`push %rbp`",
        "ins_push_r12" => "`push %r12` (41 54)",
        "ins_push_imm" => "`push $0`",
        "ins_mov_rsp" => "`mov %rsp,%rax`",
        "ins_test" => "`test %rdi,%rdi`",
        "ins_cmp" => "`cmp $0,%rdi`",
        "ins_xor" => "`xor %eax,%eax`",
        "ins_mov_rr" => "`mov %rdi,%rax`",
        "ins_mov_imm" => "`mov $1,%eax`",
        "ins_mov_load" => "`mov (%rsp),%rax`",
        "ins_mov_store" => "`mov %rdi,-8(%rsp)`",
        "ins_lea" => "`lea 8(%rdi),%rax`",
        "ins_lea_rip" => "`lea x(%rip),%rax`",
        "ins_sub_rsp" => "`sub $8,%rsp`",
        "ins_jcc" => "`je rel8`",
        "ins_jmp" => "`jmp rel8`",
        "ins_call" => "`call rel32`",
        "ins_ret" => "`ret`",
        "ins_lock" => "`lock addl $0,-8(%rsp)`",
        _ => "?",
    }
}

fn machine_info() -> Vec<(&'static str, String)> {
    let cpu = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let out = |c: &mut Command| {
        cmd::probe(c)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    vec![
        (
            "date",
            out(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"])),
        ),
        ("kernel", out(Command::new("uname").arg("-r"))),
        ("cpu", cpu),
        (
            "cpus",
            std::thread::available_parallelism()
                .map(|n| n.get().to_string())
                .unwrap_or_default(),
        ),
        (
            "memory",
            fs::read_to_string("/proc/meminfo")
                .ok()
                .and_then(|s| {
                    s.lines()
                        .next()
                        .map(|l| l.replace("MemTotal:", "").trim().to_string())
                })
                .unwrap_or_default(),
        ),
        ("bpftrace", out(Command::new("bpftrace").arg("--version"))),
    ]
}

/// Every regular file under `dir`.
fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                Ok(t) if t.is_file() => out.push(p),
                _ => {}
            }
        }
    }
    out
}
