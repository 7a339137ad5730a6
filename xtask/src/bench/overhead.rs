//! `overhead`: `bench_loop` untraced, under the empty BPF programs (the kernel's floor), under
//! memscope-bpf, bpftrace and an LD_PRELOAD interposer, rounds interleaved.

use std::{fmt::Write as _, fs, process::Command};

use anyhow::{Context, Result};

use super::{Bench, Config, TAG, fmt_ns, median, result_ab_field, result_field, spread};

impl Bench {
    pub(super) fn overhead(&mut self) -> Result<()> {
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
}
