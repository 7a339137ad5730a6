//! `stacks`: cost per traced call of stack capture in BPF (none, frame-pointer walk, walk +
//! stack copy) on the tight loop, with the events lost.

use std::{fmt::Write as _, fs, path::Path, process::Command, time::Instant};

use anyhow::{Context, Result};

use super::{Bench, TAG, fmt_ns, median, result_field, spread, tracer_totals};

impl Bench {
    pub(super) fn stacks(&mut self) -> Result<()> {
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
