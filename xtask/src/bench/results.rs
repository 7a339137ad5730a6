//! Writing the results: `docs/benchmarks.md` (tables, the issue's goals against this run and
//! the previous one, the machine), `docs/benchmarks/raw.csv` and `results.json`.

use std::{collections::BTreeMap, fmt::Write as _, fs, process::Command};

use anyhow::Result;

use super::{Bench, TAG, fmt_ns, median, spread};
use crate::cmd;

impl Bench {
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

    pub(super) fn write(&mut self, seconds: f64) -> Result<()> {
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
