//! `replay`: user-space throughput of the synthetic event stream through decode, tracker,
//! each writer and the leak analysis (`probe-user/examples/replay.rs`), with peak RSS.

use std::{fmt::Write as _, fs, path::Path, process::Command};

use anyhow::Result;

use super::{Bench, TAG, median, spread};

impl Bench {
    pub(super) fn replay(&mut self, target: &Path) -> Result<()> {
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
}
