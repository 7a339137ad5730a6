//! `torch`: the cost per PyTorch operation on the real framework (issue 31). The dispatch-bound
//! loop of `tests/fixtures/python/torch_op_loop.py` (per iteration one `torch.empty`, one
//! `x + x`, two frees) on the released torch 2.8.0 + torch_npu 2.8.0.post2 wheels and the
//! simulated CANN, untraced and under each configuration, rounds interleaved: per iteration
//! the loop thread's own CPU time, wall time, the tracer's CPU and the probe hits (BPF program
//! runs, counted in one extra round with the kernel's BPF statistics on, so that the timed
//! rounds do not pay for them). `MEMSCOPE_BENCH_BASELINE=PATH` adds a second tracer binary
//! (another commit's build) under the same configurations, interleaved with this one.

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{Bench, TAG, median, spread, tagged_field};

/// How a configuration runs the loop.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Untraced,
    /// Launch mode with these tracer options.
    Launch(&'static [&'static str]),
    /// Launch mode with the empty BPF programs at the same probes: the kernel's floor.
    Floor,
    /// Under a node agent given the CANN libraries (default sampling), the job started apart.
    Agent,
}

struct Run {
    key: String,
    desc: String,
    tracer: Option<PathBuf>,
    mode: Mode,
}

const LAUNCH: [(&str, &str, &[&str]); 5] = [
    ("defaults", "defaults (`python:16` allocating line)", &[]),
    ("none", "`--call-stack=` (no stacks)", &["--call-stack="]),
    ("python", "`--call-stack=python`", &["--call-stack=python"]),
    ("mixed", "`--call-stack=mixed`", &["--call-stack=mixed"]),
    ("c", "`--call-stack=c`", &["--call-stack=c"]),
];

/// One round's figures, per iteration.
struct Figures {
    cpu_us: f64,
    wall_us: f64,
    tracer_cpu_us: f64,
    hits: f64,
    /// Time inside the BPF programs, per iteration (counting round only).
    bpf_us: f64,
    /// The loop thread's write() calls per iteration: torch_npu's wakeups of its queue thread.
    writes: f64,
    /// Hits per program, `name:hits,...` (counting round only).
    by_program: String,
}

impl Bench {
    pub(super) fn torch(&mut self) -> Result<()> {
        let venv = crate::torch_bed::venv("2.8.0", "2.8.0.post2")?;
        let python = venv.join("bin/python");
        if !python.is_file() {
            println!("{TAG} torch: SKIPPED ({} not installed)", venv.display());
            return Ok(());
        }
        // `MEMSCOPE_BENCH_TORCH_ITERS=N` sets the timed loop's length. By default 100,000
        // iterations (~2.5 s traced, beside each run's ~7 s start-up): runs of 10,000 or 20,000
        // (~0.5 s) read 15-23 µs for one build's floor on this 2-CPU machine, as the loop's
        // two threads happened to be scheduled (benchmark-notes.md, session 15).
        let iters = std::env::var("MEMSCOPE_BENCH_TORCH_ITERS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(if self.opts.quick { 30_000 } else { 100_000 });
        let baseline = std::env::var_os("MEMSCOPE_BENCH_BASELINE").map(PathBuf::from);
        let mut runs = vec![Run {
            key: "untraced".into(),
            desc: "untraced".into(),
            tracer: None,
            mode: Mode::Untraced,
        }];
        for (bin, tag) in [
            (Some(self.tracer.clone()), ""),
            (baseline.clone(), " [base]"),
        ] {
            let Some(bin) = bin else { continue };
            for (key, desc, args) in LAUNCH {
                runs.push(Run {
                    key: format!("{key}{tag}"),
                    desc: format!("{desc}{tag}"),
                    tracer: Some(bin.clone()),
                    mode: Mode::Launch(args),
                });
            }
            runs.push(Run {
                key: format!("agent{tag}"),
                desc: format!("node agent (default sampling){tag}"),
                tracer: Some(bin.clone()),
                mode: Mode::Agent,
            });
            runs.push(Run {
                key: format!("floor{tag}"),
                desc: format!("empty BPF programs at the defaults' probes (floor){tag}"),
                tracer: Some(bin),
                mode: Mode::Floor,
            });
        }
        // `MEMSCOPE_BENCH_TORCH=untraced,defaults,none`: only these configurations (each
        // build's), for a quick look on a busy machine (a run of all of them takes ~45 loops).
        if let Some(keep) = std::env::var("MEMSCOPE_BENCH_TORCH")
            .ok()
            .filter(|v| !v.is_empty())
        {
            let keep: Vec<&str> = keep.split(',').collect();
            runs.retain(|r| keep.contains(&r.key.trim_end_matches(" [base]")));
        }
        println!(
            "{TAG} torch: {} configurations, {} rounds of {iters} iterations",
            runs.len(),
            self.opts.rounds
        );
        let load = || fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let load_before = load();
        let mut by_program = Vec::new();
        // One round counting probe hits first (what it finds holds before any timing is
        // read), then the timed rounds, interleaved.
        for round in 0..=self.opts.rounds {
            let count = round == 0;
            for r in &runs {
                if count && r.mode == Mode::Untraced {
                    continue;
                }
                let f = self
                    .torch_round(&python, r, iters, count)
                    .with_context(|| format!("torch loop under {}", r.desc))?;
                println!(
                    "{TAG}   {} {:28} cpu {:7.2} µs/it, wall {:7.2}, tracer cpu {:7.2}, hits {:.2}, \
                     in BPF {:.2} µs/it, writes {:.2}/it, by program: {}",
                    if count {
                        "hits".to_string()
                    } else {
                        format!("round {}", round - 1)
                    },
                    r.key,
                    f.cpu_us,
                    f.wall_us,
                    f.tracer_cpu_us,
                    f.hits,
                    f.bpf_us,
                    f.writes,
                    f.by_program
                );
                let w = "torch-2.8.0";
                if count {
                    self.sample("torch", w, &r.key, round, "hits", f.hits);
                    self.sample("torch", w, &r.key, round, "bpf_us", f.bpf_us);
                    by_program.push((r.key.clone(), f.by_program));
                } else {
                    self.sample("torch", w, &r.key, round, "cpu_us", f.cpu_us);
                    self.sample("torch", w, &r.key, round, "wall_us", f.wall_us);
                    self.sample("torch", w, &r.key, round, "tracer_cpu_us", f.tracer_cpu_us);
                    self.sample("torch", w, &r.key, round, "writes", f.writes);
                }
            }
        }
        let load_after = load();
        self.torch_table(&runs, iters, baseline.as_deref(), &load_before, &load_after)?;
        let mut md =
            String::from("Probe hits per iteration by BPF program (the counting round):\n\n");
        for (key, by) in by_program {
            writeln!(md, "- {key}: {}", by.replace(',', ", "))?;
        }
        md.push('\n');
        self.md.push_str(&md);
        let path = self.repo.join("docs/benchmarks-torch.md");
        let doc = fs::read_to_string(&path).unwrap_or_default() + &md;
        fs::write(path, doc)?;
        Ok(())
    }

    fn torch_round(&self, python: &Path, r: &Run, iters: u32, count: bool) -> Result<Figures> {
        let cann = self.repo.join("tests/fixtures/build/cann");
        let script = self.repo.join("tests/fixtures/python/torch_op_loop.py");
        let out_dir = self.scratch.join("torch-loop-out");
        let _ = fs::remove_dir_all(&out_dir);
        let mut job = |c: &mut Command| {
            c.env("ASCEND_HOME_PATH", &cann)
                .env("ASCEND_OPP_PATH", cann.join("opp"))
                .env("LD_LIBRARY_PATH", cann.join("lib64"))
                .env_remove("MEMSCOPE_BENCH_TRACER_PID");
            if count {
                c.env("MEMSCOPE_BENCH_COUNT_HITS", "1");
            } else {
                c.env_remove("MEMSCOPE_BENCH_COUNT_HITS");
            }
        };
        let stdout = match r.mode {
            Mode::Untraced => {
                let mut c = Command::new(python);
                c.arg(&script).arg(iters.to_string());
                job(&mut c);
                self.exec(c)?.stdout
            }
            Mode::Launch(_) | Mode::Floor => {
                let mut c = Command::new(r.tracer.as_ref().context("a tracer")?);
                c.arg("-q").arg(format!("--output={}", out_dir.display()));
                if let Mode::Launch(args) = r.mode {
                    c.args(args);
                } else {
                    c.env("MEMSCOPE_BPF_NOOP_PROGRAMS", "1");
                }
                c.arg("--").arg(python).arg(&script).arg(iters.to_string());
                job(&mut c);
                self.exec(c)?.stdout
            }
            Mode::Agent => {
                let tracer = r.tracer.as_ref().context("a tracer")?;
                self.torch_under_agent(tracer, python, &script, iters, &mut job)?
            }
        };
        let field = |k: &str| {
            tagged_field(&stdout, "RESULT ", k)
                .with_context(|| format!("no {k} in the loop's output:\n{stdout}"))
        };
        let _ = fs::remove_dir_all(&out_dir);
        Ok(Figures {
            cpu_us: field("cpu_us")?,
            wall_us: field("wall_us")?,
            tracer_cpu_us: field("tracer_cpu_us")?,
            hits: field("hits")?,
            bpf_us: field("bpf_us")?,
            writes: field("writes")?,
            by_program: stdout
                .lines()
                .find(|l| l.starts_with("RESULT "))
                .and_then(|l| l.split_whitespace().find_map(|kv| kv.strip_prefix("by=")))
                .unwrap_or("-")
                .to_string(),
        })
    }

    /// The loop as a job of its own under an agent: it waits after its warm-up until the
    /// agent has picked it up (its pid in /metrics), so the timed loop is traced.
    fn torch_under_agent(
        &self,
        tracer: &Path,
        python: &Path,
        script: &Path,
        iters: u32,
        job: &mut dyn FnMut(&mut Command),
    ) -> Result<String> {
        let cann = self.repo.join("tests/fixtures/build/cann/lib64");
        let addr = format!(
            "127.0.0.1:{}",
            std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port()
        );
        let mut agent = Command::new(tracer)
            .args(["agent", "--listen", &addr, "--log-level", "warn"])
            .arg("--lib")
            .arg(cann.join("libascend_hal.so"))
            .arg("--lib")
            .arg(cann.join("libascendcl.so"))
            .env("MEMSCOPE_BPF_DETACH", "foreground")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start the agent")?;
        let result = (|| -> Result<String> {
            let deadline = Instant::now() + Duration::from_secs(300);
            while super::agent::get(&addr, "/ready").map(|r| r.0) != Some(200) {
                if Instant::now() > deadline {
                    bail!("the agent never became ready");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let go = self.scratch.join("torch-loop-go");
            let _ = fs::remove_file(&go);
            let mut c = Command::new(python);
            c.arg(script)
                .arg(iters.to_string())
                .arg("--go")
                .arg(&go)
                .stdout(Stdio::piped())
                .stderr(Stdio::null());
            job(&mut c);
            c.env("MEMSCOPE_BENCH_TRACER_PID", agent.id().to_string());
            let mut child = c.spawn().context("cannot start the loop")?;
            let pid = child.id();
            let needle = format!("pid=\"{pid}\"");
            let deadline = Instant::now() + Duration::from_secs(300);
            while !super::agent::get(&addr, "/metrics").is_some_and(|(_, b)| b.contains(&needle)) {
                if Instant::now() > deadline || child.try_wait()?.is_some() {
                    let _ = child.kill();
                    bail!("the agent never picked up the loop ({pid})");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            fs::write(&go, b"")?;
            let out = child.wait_with_output()?;
            let _ = fs::remove_file(&go);
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        })();
        Command::new("kill")
            .args(["-TERM", &agent.id().to_string()])
            .status()?;
        agent.wait()?;
        result
    }

    fn torch_table(
        &mut self,
        runs: &[Run],
        iters: u32,
        baseline: Option<&Path>,
        load_before: &str,
        load_after: &str,
    ) -> Result<()> {
        let w = "torch-2.8.0";
        let med = |b: &Bench, k: &str, m: &str| median(&b.values("torch", w, k, m));
        let base = med(self, "untraced", "cpu_us");
        let mut md = String::new();
        writeln!(
            md,
            "## The cost per PyTorch operation (real torch + torch_npu)\n"
        )?;
        writeln!(
            md,
            "`tests/fixtures/python/torch_op_loop.py {iters}` on torch 2.8.0 + torch_npu \
             2.8.0.post2 (the released wheels) and the simulated CANN: per iteration one \
             `torch.empty`, one `x + x`, two frees. {} rounds, configurations interleaved, \
             median (min-max). *Thread CPU* is the loop thread's own CPU time per iteration \
             (`time.thread_time`), what the tracer adds to the traced thread whatever the \
             neighbours take; *tracer CPU* is the CPU all the tracer's threads ran during the \
             loop, per iteration; *probe hits* are its BPF program runs per iteration and *in BPF* \
             the time spent inside those programs (one extra round with the kernel's BPF \
             statistics on, which add two clock reads per run); *queue wakeups* are the loop \
             thread's write() calls per iteration, torch_npu's eventfd wakeups of its task \
             queue's thread (asleep on an empty queue), a system call and a wakeup on the traced \
             thread's CPU whose count depends on how fast each side runs. Load average before and after: \
             `{}` / `{}`.{}\n",
            self.opts.rounds,
            load_before.trim(),
            load_after.trim(),
            match baseline {
                Some(p) => format!(" *[base]*: the tracer binary `{}`.", p.display()),
                None => String::new(),
            }
        )?;
        writeln!(
            md,
            "| configuration | thread CPU µs/iteration (min-max) | × untraced | wall µs/iteration | queue wakeups/iteration | tracer CPU µs/iteration | probe hits/iteration | in BPF µs/iteration |"
        )?;
        writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|")?;
        for r in runs {
            let v = self.values("torch", w, &r.key, "cpu_us");
            let (lo, hi) = spread(&v);
            let hits = med(self, &r.key, "hits");
            writeln!(
                md,
                "| {} | {:.2} ({:.2}-{:.2}) | {:.2} | {:.2} | {:.2} | {} | {} | {} |",
                r.desc,
                median(&v),
                lo,
                hi,
                median(&v) / base,
                med(self, &r.key, "wall_us"),
                med(self, &r.key, "writes"),
                match med(self, &r.key, "tracer_cpu_us") {
                    t if t < 0.0 || t.is_nan() => "-".to_string(),
                    t => format!("{t:.2}"),
                },
                if hits.is_nan() || hits < 0.0 {
                    "-".to_string()
                } else {
                    format!("{hits:.2}")
                },
                match med(self, &r.key, "bpf_us") {
                    t if t < 0.0 || t.is_nan() => "-".to_string(),
                    t => format!("{t:.2}"),
                },
            )?;
        }
        writeln!(md)?;
        // Where the traced thread's microseconds go, from this run's medians: the traps
        // (the floor: the same probes with empty programs), the programs' own work without
        // stacks, and what each stack mode adds on top.
        let cpu = |k: &str| med(self, k, "cpu_us");
        let (floor, none) = (cpu("floor"), cpu("none"));
        let all = ["floor", "none", "defaults", "python", "mixed", "c"];
        if all.iter().all(|k| !cpu(k).is_nan()) {
            writeln!(
                md,
                "Where the traced thread's CPU goes per iteration (medians of this run): \
                 untraced {base:.2} µs; the traps of the probes with empty programs (floor) \
                 +{:.2}; the programs' work without stacks +{:.2} (in BPF, counting round: \
                 {:.2}); the defaults' Python line +{:.2} over no stacks; \
                 `--call-stack=python` +{:.2}, `mixed` +{:.2}, `c` +{:.2} over no stacks.\n",
                floor - base,
                none - floor,
                med(self, "none", "bpf_us"),
                cpu("defaults") - none,
                cpu("python") - none,
                cpu("mixed") - none,
                cpu("c") - none,
            )?;
        }
        self.md.push_str(&md);
        let mut doc = String::from(
            "# Benchmarks: the cost per PyTorch operation\n\nWritten by `cargo xtask bench \
             --only torch`",
        );
        if self.opts.quick {
            doc.push_str(" --quick");
        }
        let date = Command::new("date")
            .args(["-u", "+%Y-%m-%d %H:%M UTC"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        writeln!(
            doc,
            " on {date}. Times are for this machine only; compare configurations within one \
             run. What the figures mean: [benchmarks.md](benchmarks.md#the-cost-per-pytorch-operation).\n"
        )?;
        doc.push_str(&md);
        fs::write(self.repo.join("docs/benchmarks-torch.md"), doc)?;
        Ok(())
    }
}
