//! `loss`: the tight loop with 4 threads under memscope-bpf at the default ring size: events
//! recorded against calls made.

use std::fmt::Write as _;

use anyhow::Result;

use super::{Bench, Config, TAG, result_field, tracer_totals};

impl Bench {
    pub(super) fn loss(&mut self) -> Result<()> {
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
}
