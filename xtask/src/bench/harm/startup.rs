//! The `harm` section's start-up row: launch mode on a program that dlopens 200 shared
//! objects of one directory, untraced and traced with the tracer's ELF lookup cache cold and
//! warm, side by side in each round.

use std::{fmt::Write as _, fs, path::PathBuf, process::Command, time::Instant};

use anyhow::Result;

use super::{Probes, SECTION};
use crate::bench::{Bench, TAG, median, result_field};

/// The start-up row's configurations: (key, probes, ELF lookup cache emptied before each run).
fn startup_configs() -> [(&'static str, Probes, bool); 4] {
    [
        (Probes::None.key(), Probes::None, false),
        (
            "per-process multi-uprobe links, cold ELF cache",
            Probes::Scoped,
            true,
        ),
        (
            "per-process multi-uprobe links, warm ELF cache",
            Probes::Scoped,
            false,
        ),
        (
            "system-wide, one perf link per probe, warm ELF cache",
            Probes::SystemPerf,
            false,
        ),
    ]
}

impl Bench {
    /// Launch-mode start-up of a program that dlopens 200 shared objects.
    pub(super) fn harm_startup(&mut self, rounds: usize, md: &mut String) -> Result<()> {
        println!("{TAG}   launch-mode start-up with 200 shared objects");
        let dso_dir = self.lib.join("bench/dso");
        let mut dsos: Vec<PathBuf> = fs::read_dir(&dso_dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        dsos.sort();
        // The tracer's ELF lookup cache (`MEMSCOPE_BPF_CACHE`) in directories of our own: the
        // cold one emptied before each run, the warm one filled by an unmeasured run first.
        let cold_cache = self.scratch.join("harm-elf-cache-cold");
        let warm_cache = self.scratch.join("harm-elf-cache-warm");
        let _ = fs::remove_dir_all(&warm_cache);
        let out_dir = self.scratch.join("harm-startup");
        let mut prime = self.tracer(Probes::Scoped, &out_dir);
        prime
            .env("MEMSCOPE_BPF_CACHE", &warm_cache)
            .arg("--")
            .arg(self.bin.join("bench_dlopen"))
            .args(&dsos);
        self.exec(prime)?;
        let configs = startup_configs();
        // Tens of milliseconds that other processes' bursts swing by as much: several runs
        // per configuration and round, their median; the order rotates from round to round.
        let reps = if self.opts.quick { 3 } else { 5 };
        for round in 0..rounds {
            for k in 0..configs.len() {
                let (key, probes, cold) = configs[(round + k) % configs.len()];
                let (mut own, mut wall) = (Vec::new(), Vec::new());
                for _ in 0..reps {
                    let _ = fs::remove_dir_all(&out_dir);
                    let cache = if cold { &cold_cache } else { &warm_cache };
                    if cold {
                        let _ = fs::remove_dir_all(cache);
                    }
                    let mut c = if probes == Probes::None {
                        Command::new(self.bin.join("bench_dlopen"))
                    } else {
                        let mut c = self.tracer(probes, &out_dir);
                        c.env("MEMSCOPE_BPF_DETACH", "foreground")
                            .env("MEMSCOPE_BPF_CACHE", cache)
                            .arg("--")
                            .arg(self.bin.join("bench_dlopen"));
                        c
                    };
                    c.args(&dsos);
                    let started = Instant::now();
                    let out = self.exec(c)?;
                    wall.push(started.elapsed().as_secs_f64() * 1e3);
                    own.push(result_field(&out.stdout, "elapsed_ns").unwrap_or(f64::NAN) / 1e6);
                }
                self.sample(
                    SECTION,
                    "dlopen_200",
                    key,
                    round,
                    "program_ms",
                    median(&own),
                );
                self.sample(SECTION, "dlopen_200", key, round, "wall_ms", median(&wall));
            }
        }
        writeln!(
            md,
            "### Launch-mode start-up of a program that loads 200 shared objects\n\n\
             `bench_dlopen` dlopens 200 small libraries of one directory by path (none holds a \
             probed function; none was planned ahead: the first open stops the target, the \
             directory is listed and the next objects planned at that stop, the rest while \
             it runs on). *program*: its own time from \
             `main` to the last `dlopen`; *wall*: the whole command, tracer start-up (BPF load) \
             and exit included. *cold*: the tracer's ELF lookup cache emptied before each run; \
             *warm*: filled by an earlier run (a `stat` per object instead of reading it). \
             {rounds} rounds, the order rotating; in each, the median of {reps} runs per \
             configuration.\n"
        )?;
        writeln!(
            md,
            "| configuration | program ms | vs no tracer | wall ms |\n|---|---:|---:|---:|"
        )?;
        let ms = |v: f64| format!("{v:.1}");
        let base = median(&self.values(SECTION, "dlopen_200", Probes::None.key(), "program_ms"));
        for (key, _, _) in configs {
            let v = median(&self.values(SECTION, "dlopen_200", key, "program_ms"));
            writeln!(
                md,
                "| {key} | {} | {:.2}× | {} |",
                self.cell("dlopen_200", key, "program_ms", ms),
                v / base,
                self.cell("dlopen_200", key, "wall_ms", ms)
            )?;
        }
        writeln!(md)?;
        Ok(())
    }
}
