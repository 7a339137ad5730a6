//! The `harm` section: what tracing costs the processes that are not traced, and what is left
//! once the tracer has gone. Three configurations side by side in each round:
//! no tracer; the tracer as built (probes only in the traced processes, one multi-uprobe link
//! per library and program); and the design before it (`MEMSCOPE_BPF_SCOPE=system`
//! `MEMSCOPE_BPF_NO_MULTI_UPROBE=1`: probes in every process mapping the library, one perf
//! link per probe).

use std::{
    fmt::Write as _,
    fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{Bench, TAG, fmt_ns, median, result_field, spread};

mod startup;
mod torch;

const SECTION: &str = "harm";

/// A tracer configuration of this section.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Probes {
    None,
    Scoped,
    SystemPerf,
}

impl Probes {
    fn key(self) -> &'static str {
        match self {
            Probes::None => "no tracer",
            Probes::Scoped => "per-process multi-uprobe links",
            Probes::SystemPerf => "system-wide, one perf link per probe",
        }
    }
    fn env(self, c: &mut Command) {
        if self == Probes::SystemPerf {
            c.env("MEMSCOPE_BPF_SCOPE", "system")
                .env("MEMSCOPE_BPF_NO_MULTI_UPROBE", "1");
        } else {
            c.env_remove("MEMSCOPE_BPF_SCOPE")
                .env_remove("MEMSCOPE_BPF_NO_MULTI_UPROBE");
        }
    }
}

const ALL: [Probes; 3] = [Probes::None, Probes::Scoped, Probes::SystemPerf];

/// A background process whose stdout or stderr lines are collected.
struct Watched {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Watched {
    fn spawn(mut c: Command, watch_stderr: bool) -> Result<Watched> {
        if watch_stderr {
            c.stderr(Stdio::piped()).stdout(Stdio::null());
        } else {
            c.stdout(Stdio::piped()).stderr(Stdio::null());
        }
        let mut child = c
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot run {c:?}"))?;
        let pipe: Box<dyn std::io::Read + Send> = if watch_stderr {
            Box::new(child.stderr.take().unwrap())
        } else {
            Box::new(child.stdout.take().unwrap())
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Watched {
            child,
            lines: rx,
            seen: Vec::new(),
        })
    }

    /// Waits for a line containing `needle`; returns it.
    fn wait_for(&mut self, needle: &str, secs: u64) -> Result<String> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(l) = self.seen.iter().find(|l| l.contains(needle)) {
                return Ok(l.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => self.seen.push(l),
                Err(_) => bail!(
                    "no line with {needle:?} within {secs} s; so far:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the process and collects the rest of its lines.
    fn finish(self) -> Result<Vec<String>> {
        self.finish_with(0)
    }

    /// As `finish`, `code` being the exit status that means success (130 after SIGINT).
    fn finish_with(mut self, code: i32) -> Result<Vec<String>> {
        let status = self.child.wait()?;
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(2)) {
            self.seen.push(l);
        }
        if status.code() != Some(code) {
            bail!("exited with {status}:\n{}", self.seen.join("\n"));
        }
        Ok(self.seen)
    }
}

/// SIGINT to a child we started (kill(1): xtask has no libc binding).
fn interrupt(pid: u32) {
    let _ = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status();
}

/// A `--pid` tracer run as a user ends one: its "attached" line, SIGINT 0.3 s later (the
/// handler is in place once its session runs, just after the line), exit status 130.
struct PidRun {
    /// From starting the command to the "attached" line.
    to_attached_ms: f64,
    /// From SIGINT to the tracer's exit.
    exit_ms: f64,
    /// Its stderr.
    lines: Vec<String>,
}

fn run_pid_tracer(tracer: Command) -> Result<PidRun> {
    let started = Instant::now();
    let mut t = Watched::spawn(tracer, true)?;
    t.wait_for("attached to pid", 120)?;
    let to_attached_ms = started.elapsed().as_secs_f64() * 1e3;
    std::thread::sleep(Duration::from_millis(300));
    let interrupted = Instant::now();
    interrupt(t.pid());
    let lines = t.finish_with(130).context("tracer")?;
    Ok(PidRun {
        to_attached_ms,
        exit_ms: interrupted.elapsed().as_secs_f64() * 1e3,
        lines,
    })
}

fn field(lines: &[String], key: &str) -> Option<f64> {
    lines
        .iter()
        .find(|l| l.starts_with("RESULT"))
        .and_then(|l| result_field(l, key))
}

impl Bench {
    pub(super) fn harm(&mut self, target: &Path) -> Result<()> {
        println!("{TAG} harm: untraced processes, detach, attach, start-up");
        let rounds = self.opts.rounds;
        let mut md = String::new();
        writeln!(md, "## Do no harm\n")?;
        writeln!(
            md,
            "Three configurations side by side in each round: **no tracer**; the tracer as \
             built (**per-process multi-uprobe links**: breakpoints only in the traced \
             processes, one link per library and program); and the design before it \
             (**system-wide, one perf link per probe**: `MEMSCOPE_BPF_SCOPE=system \
             MEMSCOPE_BPF_NO_MULTI_UPROBE=1`). Median of {rounds} rounds, min–max in \
             brackets.\n"
        )?;
        self.harm_neighbour(rounds, &mut md)?;
        self.harm_syscall_hook(rounds, &mut md)?;
        self.harm_after_exit(rounds, &mut md)?;
        self.harm_attach_cost(target, &mut md)?;
        self.harm_startup(rounds, &mut md)?;
        self.harm_pid_attach(rounds, &mut md)?;
        self.harm_real_torch(rounds, &mut md)?;
        self.md.push_str(&md);
        let path = self.repo.join("docs/benchmarks-harm.md");
        let mut doc =
            String::from("# Benchmarks: do no harm\n\nWritten by `cargo xtask bench --only harm`");
        if self.opts.quick {
            doc.push_str(" --quick");
        }
        writeln!(
            doc,
            " on {} (kernel {}). Times are for this machine only.\n",
            chrono_like_now(),
            kernel_release()
        )?;
        doc.push_str(&md);
        fs::write(&path, doc)?;
        println!("{TAG} wrote {}", path.display());
        Ok(())
    }

    fn cell(&self, workload: &str, config: &str, metric: &str, fmt: fn(f64) -> String) -> String {
        let v = self.values(SECTION, workload, config, metric);
        if v.is_empty() {
            return "–".into();
        }
        let (lo, hi) = spread(&v);
        format!("{} [{}–{}]", fmt(median(&v)), fmt(lo), fmt(hi))
    }

    fn bench_loop(&self, iters: u64, wait_file: Option<&Path>) -> Command {
        let mut c = Command::new(self.bin.join("bench_loop"));
        c.args(["--mode", "hal", "--iters", &iters.to_string()]);
        if let Some(w) = wait_file {
            c.arg("--wait-file").arg(w);
        }
        c.current_dir(&self.repo);
        c
    }

    fn tracer(&self, probes: Probes, out: &Path) -> Command {
        let mut c = Command::new(&self.tracer);
        c.arg(format!("--output-path={}", out.display()))
            .current_dir(&self.repo);
        probes.env(&mut c);
        c
    }

    /// An untraced HAL loop while another process on the same library is traced.
    fn harm_neighbour(&mut self, rounds: usize, md: &mut String) -> Result<()> {
        println!("{TAG}   neighbour loop while another process is traced");
        let iters: u64 = if self.opts.quick {
            1_000_000
        } else {
            3_000_000
        };
        let (reps, pin) =
            self.untraced_loops("neighbour_traced_elsewhere", "hal", iters, rounds)?;
        writeln!(
            md,
            "### An untraced process while another one is traced\n\n`bench_loop --mode hal` \
             ({iters} `halMemAlloc`+`halMemFree` pairs, not traced) while `workload --loop-ms` \
             on the same `libascend_hal.so` runs under the tracer (launch mode). {}\n",
            loop_method(rounds, reps, pin)
        )?;
        self.untraced_loop_table(md, "neighbour_traced_elsewhere", "ns per pair", |p| {
            p.key().to_owned()
        })
    }

    /// What the launch-mode tracer's system-call hooks cost a process it does not trace: the
    /// `sys_exit` raw tracepoint that holds new children of the traced tree runs on every
    /// system call's exit on the machine (per-process links only; the system-wide design
    /// has no such hold), the `openat` tracepoints on every `openat`.
    fn harm_syscall_hook(&mut self, rounds: usize, md: &mut String) -> Result<()> {
        println!("{TAG}   untraced system calls during a launch-mode trace");
        let iters: u64 = if self.opts.quick {
            1_000_000
        } else {
            3_000_000
        };
        let (reps, pin) =
            self.untraced_loops("syscalls_traced_elsewhere", "syscall", iters, rounds)?;
        writeln!(
            md,
            "### System calls of an untraced process during a launch-mode trace\n\n\
             `bench_loop --mode syscall` ({iters} `getppid` system calls, not traced) while \
             `workload --loop-ms` runs under the tracer in launch mode. With per-process \
             links the tracer adds a `sys_exit` raw tracepoint (it holds each new process of \
             the traced tree at its first return to user space until its probes exist); the \
             system-wide configuration runs without it. Both have the `openat` tracepoints. {}\n",
            loop_method(rounds, reps, pin)
        )?;
        self.untraced_loop_table(
            md,
            "syscalls_traced_elsewhere",
            "ns per system call",
            |p| match p {
                Probes::None => p.key().to_owned(),
                Probes::Scoped => format!("{} (`sys_exit` hook on)", p.key()),
                Probes::SystemPerf => format!("{} (no `sys_exit` hook)", p.key()),
            },
        )
    }

    /// Rounds of an untraced `bench_loop --mode MODE` beside a traced `workload` in each
    /// configuration, the configurations' order rotating from round to round; `reps` loops
    /// per configuration and round, whose median is the round's figure. Returns (reps, pinned).
    fn untraced_loops(
        &mut self,
        workload: &str,
        mode: &str,
        iters: u64,
        rounds: usize,
    ) -> Result<(usize, bool)> {
        let reps = if self.opts.quick { 3 } else { 5 };
        // The untraced loop keeps one CPU, the traced workload the other, when there are two:
        // no migrations between the loop's timer reads.
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let pin = cpus >= 2 && Path::new("/usr/bin/taskset").exists();
        for round in 0..rounds {
            for k in 0..ALL.len() {
                let probes = ALL[(round + k) % ALL.len()];
                let dir = self.scratch.join("harm-neighbour");
                let _ = fs::remove_dir_all(&dir);
                fs::create_dir_all(&dir)?;
                let stop = dir.join("stop");
                let log = dir.join("gt.log");
                let tracer = if probes == Probes::None {
                    None
                } else {
                    let mut c = self.tracer(probes, &dir.join("out"));
                    c.env("MEMSCOPE_BPF_DETACH", "foreground").arg("--");
                    if pin {
                        c.args(["/usr/bin/taskset", "-c", "0"]);
                    }
                    c.arg(self.bin.join("workload"))
                        .args(["--loop-ms", "600000", "--stop-file"])
                        .arg(&stop)
                        .arg("--log")
                        .arg(&log);
                    let t = Watched::spawn(c, true)?;
                    wait_for_file_text(&log, "FREE", 60)?;
                    Some(t)
                };
                let (mut cpu, mut wall) = (Vec::new(), Vec::new());
                for _ in 0..reps {
                    let mut c = if pin {
                        let mut c = Command::new("/usr/bin/taskset");
                        c.args(["-c", "1"]).arg(self.bin.join("bench_loop"));
                        c
                    } else {
                        Command::new(self.bin.join("bench_loop"))
                    };
                    c.args(["--mode", mode, "--iters", &iters.to_string()]);
                    let out = self.exec(c)?;
                    // A HAL iteration is two calls (a pair); a system call is one.
                    let per = if mode == "hal" { 2.0 } else { 1.0 };
                    cpu.push(
                        result_field(&out.stdout, "cpu_ns_per_call").unwrap_or(f64::NAN) * per,
                    );
                    wall.push(result_field(&out.stdout, "ns_per_call").unwrap_or(f64::NAN) * per);
                }
                fs::write(&stop, b"")?;
                if let Some(t) = tracer {
                    t.finish().context("tracer")?;
                }
                let key = probes.key();
                self.sample(SECTION, workload, key, round, "cpu_ns", median(&cpu));
                self.sample(SECTION, workload, key, round, "wall_ns", median(&wall));
            }
        }
        Ok((reps, pin))
    }

    fn untraced_loop_table(
        &self,
        md: &mut String,
        workload: &str,
        unit: &str,
        label: impl Fn(Probes) -> String,
    ) -> Result<()> {
        writeln!(
            md,
            "| configuration | CPU {unit} | vs no tracer | wall {unit} | vs no tracer |\n\
             |---|---:|---:|---:|---:|"
        )?;
        let base =
            |metric: &str| median(&self.values(SECTION, workload, Probes::None.key(), metric));
        let (base_cpu, base_wall) = (base("cpu_ns"), base("wall_ns"));
        for probes in ALL {
            let v = |metric: &str| median(&self.values(SECTION, workload, probes.key(), metric));
            writeln!(
                md,
                "| {} | {} | {:.2}× | {} | {:.2}× |",
                label(probes),
                self.cell(workload, probes.key(), "cpu_ns", fmt_ns),
                v("cpu_ns") / base_cpu,
                self.cell(workload, probes.key(), "wall_ns", fmt_ns),
                v("wall_ns") / base_wall,
            )?;
        }
        writeln!(md)?;
        Ok(())
    }

    /// The traced target's and a neighbour's loop 0.5 s after the tracer (attach mode) exits.
    fn harm_after_exit(&mut self, rounds: usize, md: &mut String) -> Result<()> {
        let iters: u64 = if self.opts.quick { 200_000 } else { 1_000_000 };
        println!("{TAG}   loops 0.5 s after the tracer exits");
        for round in 0..rounds {
            for probes in ALL {
                let dir = self.scratch.join("harm-after");
                let _ = fs::remove_dir_all(&dir);
                fs::create_dir_all(&dir)?;
                let go = dir.join("go");
                // The previous configuration's tracer may still be tearing its links down in
                // its background detach process: that would be measured as this one's cost.
                wait_for_no_tracer(60)?;
                let mut target = Watched::spawn(self.bench_loop(iters, Some(&go)), false)?;
                target.wait_for("WAITING", 30)?;
                let mut neighbour = Watched::spawn(self.bench_loop(iters, Some(&go)), false)?;
                neighbour.wait_for("WAITING", 30)?;
                let mut exit_to_go = f64::NAN;
                if probes != Probes::None {
                    // As users run it: the teardown goes to the background at exit.
                    let mut c = self.tracer(probes, &dir.join("out"));
                    c.env_remove("MEMSCOPE_BPF_DETACH")
                        .args(["--pid", &target.pid().to_string()]);
                    let run = run_pid_tracer(c)?;
                    let exited = Instant::now();
                    self.sample(
                        SECTION,
                        "after_exit",
                        probes.key(),
                        round,
                        "exit_ms",
                        run.exit_ms,
                    );
                    std::thread::sleep(Duration::from_millis(500));
                    exit_to_go = exited.elapsed().as_secs_f64();
                }
                fs::write(&go, b"")?;
                let t = target.finish().context("target")?;
                let n = neighbour.finish().context("neighbour")?;
                // Wall and the loop's own CPU time (a trap counts there; other processes'
                // use of the shared CPUs does not).
                for (row, out) in [("after_exit_target", &t), ("after_exit_neighbour", &n)] {
                    for (field_name, metric) in [
                        ("ns_per_call", "ns_per_pair"),
                        ("cpu_ns_per_call", "cpu_ns_per_pair"),
                    ] {
                        let per_pair = field(out, field_name).unwrap_or(f64::NAN) * 2.0;
                        self.sample(SECTION, row, probes.key(), round, metric, per_pair);
                    }
                }
                if exit_to_go.is_finite() {
                    self.sample(
                        SECTION,
                        "after_exit",
                        probes.key(),
                        round,
                        "exit_to_loop_s",
                        exit_to_go,
                    );
                }
            }
        }
        writeln!(
            md,
            "### 0.5 s after the tracer exits\n\nTwo `bench_loop --mode hal` processes wait; \
             the tracer attaches to one (`--pid`), is stopped with SIGINT 0.3 s later, and \
             0.5 s after it has exited both run {iters} pairs at once (two CPUs). Each \
             configuration starts once no tracer process (nor a background detach process \
             of the one before) is left. *CPU*: each loop's own CPU time per pair (a trap \
             and its BPF program count there); *wall*: its wall time; *exit*: SIGINT to the \
             tracer's exit, multi-uprobe links closed included.\n"
        )?;
        writeln!(
            md,
            "| configuration | target CPU ns | vs no tracer | neighbour CPU ns | vs no tracer | target wall ns | neighbour wall ns | exit ms |\n|---|---:|---:|---:|---:|---:|---:|---:|"
        )?;
        let base = |row: &str, metric: &str| {
            median(&self.values(SECTION, row, Probes::None.key(), metric))
        };
        let (base_t, base_n) = (
            base("after_exit_target", "cpu_ns_per_pair"),
            base("after_exit_neighbour", "cpu_ns_per_pair"),
        );
        for probes in ALL {
            let key = probes.key();
            let t = median(&self.values(SECTION, "after_exit_target", key, "cpu_ns_per_pair"));
            let n = median(&self.values(SECTION, "after_exit_neighbour", key, "cpu_ns_per_pair"));
            let exit = match probes {
                Probes::None => "–".to_string(),
                _ => self.cell("after_exit", key, "exit_ms", |v| format!("{v:.0}")),
            };
            writeln!(
                md,
                "| {key} | {} | {:.2}× | {} | {:.2}× | {} | {} | {exit} |",
                self.cell("after_exit_target", key, "cpu_ns_per_pair", fmt_ns),
                t / base_t,
                self.cell("after_exit_neighbour", key, "cpu_ns_per_pair", fmt_ns),
                n / base_n,
                self.cell("after_exit_target", key, "ns_per_pair", fmt_ns),
                self.cell("after_exit_neighbour", key, "ns_per_pair", fmt_ns),
            )?;
        }
        writeln!(md)?;
        Ok(())
    }

    /// Attach and detach time of 10/100/1000 probes (entry and return) in one library.
    fn harm_attach_cost(&mut self, target: &Path, md: &mut String) -> Result<()> {
        println!("{TAG}   attach and detach of 10/100/1000 probed functions");
        let exe = target.join("release/examples/attach_cost");
        let lib = self.lib.join("bench/libmany.so");
        let hold = self.scratch.join("harm-hold");
        let _ = fs::remove_file(&hold);
        let mut c = Command::new(self.bin.join("bench_dlopen"));
        c.arg("--hold-file").arg(&hold).arg(&lib);
        let mut holder = Watched::spawn(c, false)?;
        holder.wait_for("HOLDING", 30)?;
        let rounds = self.opts.rounds.min(3);
        // Perf links cost a grace period each to detach (~0.1 s here): 1000 functions would
        // take minutes, so they are measured up to 100 (both ends of each function: 2 links).
        let perf_max = if self.opts.quick { 10 } else { 100 };
        for round in 0..rounds {
            for count in [10usize, 100, 1000] {
                for (config, perf) in [
                    ("multi-uprobe link, one process", false),
                    ("perf links, one process", true),
                ] {
                    if perf && count > perf_max {
                        continue;
                    }
                    let mut c = Command::new(&exe);
                    c.arg("--lib").arg(&lib).args([
                        "--count",
                        &count.to_string(),
                        "--pid",
                        &holder.pid().to_string(),
                    ]);
                    if perf {
                        c.env("MEMSCOPE_BPF_NO_MULTI_UPROBE", "1");
                    } else {
                        c.env_remove("MEMSCOPE_BPF_NO_MULTI_UPROBE");
                    }
                    let out = self.exec(c)?;
                    let w = format!("{count} functions");
                    for metric in ["attach_ms", "detach_ms"] {
                        let v = result_field(&out.stdout, metric).unwrap_or(f64::NAN);
                        self.sample(SECTION, &w, config, round, metric, v);
                    }
                }
            }
        }
        fs::write(&hold, b"")?;
        holder.finish()?;
        writeln!(
            md,
            "### Attach and detach of many probed functions\n\nEntry and return programs on \
             the first N of the 1000 exported functions of `tests/fixtures/build/lib/bench/libmany.so` \
             (generated C), scoped to one process that maps it \
             (`probe-user/examples/attach_cost.rs`: `Bpf::attach_many`, then dropping \
             everything). Milliseconds; perf links are measured up to {perf_max} functions \
             (each link costs a grace period to detach).\n"
        )?;
        writeln!(
            md,
            "| functions | links | attach ms | detach ms |\n|---:|---|---:|---:|"
        )?;
        let ms = |v: f64| format!("{v:.1}");
        for count in [10usize, 100, 1000] {
            for config in ["multi-uprobe link, one process", "perf links, one process"] {
                let w = format!("{count} functions");
                if self.values(SECTION, &w, config, "attach_ms").is_empty() {
                    continue;
                }
                writeln!(
                    md,
                    "| {count} | {config} | {} | {} |",
                    self.cell(&w, config, "attach_ms", ms),
                    self.cell(&w, config, "detach_ms", ms)
                )?;
            }
        }
        writeln!(md)?;
        Ok(())
    }

    /// From `--pid` to "attached" on a process that maps the largest libraries here.
    fn harm_pid_attach(&mut self, rounds: usize, md: &mut String) -> Result<()> {
        println!("{TAG}   --pid to attached on a process mapping large libraries");
        let mut libs: Vec<(PathBuf, u64)> = super::largest_shared_objects(12)
            .into_iter()
            .filter(|(p, _)| {
                // Only what dlopen accepts on its own (no missing dependencies).
                Command::new(self.bin.join("bench_dlopen"))
                    .arg(p)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            })
            .take(5)
            .collect();
        libs.push((self.lib.join("libascend_hal.so"), 0));
        let total: u64 = libs.iter().map(|l| l.1).sum();
        let hold = self.scratch.join("harm-pid-hold");
        for round in 0..rounds {
            for probes in [Probes::Scoped, Probes::SystemPerf] {
                let _ = fs::remove_file(&hold);
                let mut c = Command::new(self.bin.join("bench_dlopen"));
                c.arg("--hold-file").arg(&hold);
                c.args(libs.iter().map(|l| &l.0));
                let mut holder = Watched::spawn(c, false)?;
                holder.wait_for("HOLDING", 60)?;
                let out_dir = self.scratch.join("harm-pid");
                let _ = fs::remove_dir_all(&out_dir);
                let mut c = self.tracer(probes, &out_dir);
                c.env("MEMSCOPE_BPF_DETACH", "foreground")
                    .args(["--pid", &holder.pid().to_string()]);
                let attached = run_pid_tracer(c)?.to_attached_ms;
                fs::write(&hold, b"")?;
                holder.finish()?;
                self.sample(
                    SECTION,
                    "pid_attach",
                    probes.key(),
                    round,
                    "to_attached_ms",
                    attached,
                );
            }
        }
        writeln!(
            md,
            "### `--pid` to \"attached\" on a process mapping large libraries\n\n\
             `bench_dlopen` holding {} libraries ({:.0} MiB in all: {}), time from starting \
             `memscope-bpf --pid` to its \"attached\" line (BPF load included).\n",
            libs.len(),
            total as f64 / (1u64 << 20) as f64,
            libs.iter()
                .map(|l| l
                    .0
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned())
                .collect::<Vec<_>>()
                .join(", ")
        )?;
        writeln!(md, "| configuration | ms to attached |\n|---|---:|")?;
        let ms = |v: f64| format!("{v:.0}");
        for probes in [Probes::Scoped, Probes::SystemPerf] {
            writeln!(
                md,
                "| {} | {} |",
                probes.key(),
                self.cell("pid_attach", probes.key(), "to_attached_ms", ms)
            )?;
        }
        writeln!(md)?;
        Ok(())
    }
}

/// How the untraced-loop tables were measured.
fn loop_method(rounds: usize, reps: usize, pinned: bool) -> String {
    format!(
        "{rounds} rounds, the configurations' order rotating; in each, {reps} loops per \
         configuration and their median. *CPU*: the loop's own CPU time per iteration \
         (`CLOCK_PROCESS_CPUTIME_ID`: a trap and its BPF program count, time the CPU spent on \
         other processes of this shared machine does not); *wall*: its wall time. Median over \
         rounds, min–max in brackets.{}",
        if pinned {
            " The untraced loop runs on CPU 1, the traced workload on CPU 0 (`taskset`)."
        } else {
            ""
        }
    )
}

/// Waits until no `memscope-bpf` process is left (a tracer's background detach process lives
/// until every link it holds is released).
fn wait_for_no_tracer(secs: u64) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let alive = fs::read_dir("/proc")?
            .filter_map(|e| e.ok())
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .bytes()
                    .all(|b| b.is_ascii_digit())
            })
            .any(|e| {
                fs::read_to_string(e.path().join("comm"))
                    .is_ok_and(|c| c.trim_end() == "memscope-bpf")
            });
        if !alive {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("a memscope-bpf process is still running after {secs} s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_for_file_text(path: &Path, needle: &str, secs: u64) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !fs::read_to_string(path).is_ok_and(|t| t.contains(needle)) {
        if Instant::now() > deadline {
            bail!("{} never showed {needle:?}", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

pub(super) fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The current UTC time as `YYYY-MM-DD HH:MM UTC` (from `date`, no extra crate).
pub(super) fn chrono_like_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}
