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
        self.python_stacks()?;
        Ok(())
    }

    /// Mixed stacks on real PyTorch (torch_npu 2.14.0, whose allocator path is 9.4 KiB deep
    /// under some operations): the copy that reaches past the outermost interpreter loop
    /// against the 8 KiB copy of before (`MEMSCOPE_BPF_STACK_MODE=copy-8k`), interleaved.
    fn python_stacks(&mut self) -> Result<()> {
        let venv = crate::torch_bed::venv("2.14.0", "2.14.0")?;
        let python = venv.join("bin/python");
        if !python.is_file() {
            println!(
                "{TAG} mixed stacks on torch: SKIPPED ({} not installed)",
                venv.display()
            );
            return Ok(());
        }
        println!("{TAG} mixed stacks on torch_npu 2.14.0");
        let cann = self.repo.join("tests/fixtures/build/cann");
        let script = self.repo.join("tests/fixtures/python/torch_npu_train.py");
        let modes: [(&str, &str, Option<&str>); 2] = [
            ("before", "8 KiB copy (before)", Some("copy-8k")),
            ("after", "copy past the outermost interpreter loop", None),
        ];
        let out_dir = self.scratch.join("torch-out");
        for round in 0..self.opts.rounds {
            for (key, _, env) in modes {
                let _ = fs::remove_dir_all(&out_dir);
                let log = self.scratch.join("torch-gt.log");
                let mut c = Command::new(&self.tracer);
                c.arg(format!("--output={}", out_dir.display()))
                    .arg("--call-stack=mixed")
                    .arg("--")
                    .arg(&python)
                    .arg(&script)
                    .args(["--steps", "5", "--log"])
                    .arg(&log)
                    .env("ASCEND_HOME_PATH", &cann)
                    .env("ASCEND_OPP_PATH", cann.join("opp"))
                    .env("LD_LIBRARY_PATH", cann.join("lib64"));
                match env {
                    Some(m) => c.env("MEMSCOPE_BPF_STACK_MODE", m),
                    None => c.env_remove("MEMSCOPE_BPF_STACK_MODE"),
                };
                let out = self.exec(c)?;
                let cpu = tracer_cpu_s(&out.stderr);
                let (copies, each) = copies_and_size(&out.stderr)
                    .with_context(|| format!("no stack copy summary:\n{}", out.stderr))?;
                let (rows, with_python) = pta_rows_with_python(&out_dir);
                println!(
                    "{TAG}   round {round} {key:6} {copies} copies of {each} bytes, tracer CPU \
                     {cpu:.2} s, {with_python} of {rows} PTA rows with their Python frames"
                );
                let w = "torch-2.14.0";
                self.sample("stacks", w, key, round, "copies", copies as f64);
                self.sample("stacks", w, key, round, "bytes_per_copy", each as f64);
                self.sample("stacks", w, key, round, "tracer_cpu_s", cpu);
                self.sample("stacks", w, key, round, "pta_rows", rows as f64);
                self.sample("stacks", w, key, round, "with_python", with_python as f64);
            }
        }
        let _ = fs::remove_dir_all(&out_dir);
        let w = "torch-2.14.0";
        let med = |k: &str, m: &str| median(&self.values("stacks", w, k, m));
        let mut md = String::new();
        writeln!(
            md,
            "### Mixed stacks on real PyTorch (`--call-stack=mixed`)\n"
        )?;
        writeln!(
            md,
            "`torch_npu_train.py --steps 5` on torch 2.14.0 + torch_npu 2.14.0 (the simulated CANN) \
             in launch mode, {} rounds, the two copies interleaved, median. Stacks per second is \
             the stack samples over the tracer's own CPU time (user + system, whole run: start-up, \
             symbols, unwinding); bytes per copy is what BPF copied into the ring per sample. A PTA \
             row has its Python frames when its C column holds them (the copy reached the \
             interpreter loop).\n",
            self.opts.rounds
        )?;
        writeln!(
            md,
            "| copy | stack samples | bytes per copy | tracer CPU s | stacks per tracer CPU second | PTA rows with their Python frames |"
        )?;
        writeln!(md, "|---|---:|---:|---:|---:|---:|")?;
        for (key, desc, _) in modes {
            let (copies, cpu) = (med(key, "copies"), med(key, "tracer_cpu_s"));
            writeln!(
                md,
                "| {desc} | {copies:.0} | {:.0} | {cpu:.2} | {:.0} | {:.0} of {:.0} |",
                med(key, "bytes_per_copy"),
                copies / cpu,
                med(key, "with_python"),
                med(key, "pta_rows"),
            )?;
        }
        writeln!(md)?;
        self.md.push_str(&md);
        Ok(())
    }
}

/// The tracer's own CPU seconds from its stack copy summary (`(tracer CPU X s)`), NaN without.
fn tracer_cpu_s(stderr: &str) -> f64 {
    stderr
        .lines()
        .find_map(|l| {
            let rest = l.split("(tracer CPU ").nth(1)?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or(f64::NAN)
}

/// (copies, bytes each) from `N call stack(s) copied for unwinding, X each on average`.
fn copies_and_size(stderr: &str) -> Option<(u64, u64)> {
    let line = stderr
        .lines()
        .find(|l| l.contains("call stack(s) copied for unwinding"))?;
    let n = line
        .trim_start_matches("[memscope-bpf] ")
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    // `9.90 KiB (10140 bytes)` or `512 bytes`.
    let tail = line.split(" each on average").next()?;
    let bytes = match tail.rsplit_once('(') {
        Some((_, b)) => b.trim_end_matches(" bytes)").parse().ok()?,
        None => tail
            .rsplit(", ")
            .next()?
            .trim_end_matches(" bytes")
            .parse()
            .ok()?,
    };
    Some((n, bytes))
}

/// (PTA rows, those whose C stack column holds Python frames) in the dumps under `dir`.
fn pta_rows_with_python(dir: &Path) -> (u64, u64) {
    let (mut rows, mut with) = (0, 0);
    let dumps = files_under(dir, |p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("memscope_dump_"))
    });
    for dump in dumps {
        let text = fs::read_to_string(&dump).unwrap_or_default();
        for record in csv_records(&text) {
            if record.split(',').nth(2) == Some("PTA") {
                rows += 1;
                with += record.contains(" [python] ") as u64;
            }
        }
    }
    (rows, with)
}

/// (rows with a C stack, rows whose stack is truncated) in the CSV files under `dir`.
fn csv_stacks(dir: &Path) -> (u64, u64) {
    let files = files_under(dir, |p| p.extension().is_some_and(|x| x == "csv"));
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

/// The records of a CSV text: lines, except that a newline inside quotes (a stack field)
/// belongs to its record.
fn csv_records(text: &str) -> Vec<&str> {
    let (mut records, mut start, mut quoted) = (Vec::new(), 0, false);
    for (i, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '\n' if !quoted => {
                records.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < text.len() {
        records.push(&text[start..]);
    }
    records
}

/// The files under `dir` (at any depth) that `keep` takes.
fn files_under(dir: &Path, keep: impl Fn(&Path) -> bool) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if keep(&p) {
                files.push(p);
            }
        }
    }
    files
}
