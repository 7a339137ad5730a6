//! `placement`: `halMemFree` in a loop with naive entry placement against the placement
//! rule, and the events recorded under both.

use std::fmt::Write as _;

use anyhow::{Context, Result};

use super::{Bench, Config, TAG, fmt_ns, median, result_field, spread};

impl Bench {
    pub(super) fn placement(&mut self) -> Result<()> {
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
}
