//! The `harm` section on the real-framework test bed (`crate::torch_bed`): the released torch
//! and torch_npu wheels running `tests/fixtures/python/torch_npu_train.py` on the simulated CANN.
//! Launch-mode start-up against the same script untraced, and `--pid` to "attached" on a
//! running torch process (torch_cpu, torch_cuda, torch_npu and the nvidia-* libraries mapped).

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{Probes, SECTION, run_pid_tracer};
use crate::bench::{Bench, TAG, median};

/// What the real script needs: its interpreter, the simulated CANN, the script.
struct Bed {
    python: PathBuf,
    release: String,
    cann: PathBuf,
    script: PathBuf,
}

impl Bed {
    /// The first release of the bed, or why there is none.
    fn find(repo: &Path) -> Result<Bed, String> {
        if !crate::torch_bed::enabled() {
            return Err("MEMSCOPE_TORCH_BED=off".into());
        }
        let venv = crate::torch_bed::venvs()
            .map_err(|e| format!("{e:#}"))?
            .into_iter()
            .next()
            .ok_or("no release in the bed")?;
        let python = venv.join("bin/python");
        if !venv.join(".memscope-ready").is_file() || !python.is_file() {
            return Err(format!(
                "no finished test-bed venv at {} (`cargo xtask setup` makes it)",
                venv.display()
            ));
        }
        let cann = repo.join("tests/fixtures/build/cann");
        if !cann.join("lib64/libascendcl.so").is_file() {
            return Err(format!(
                "no simulated CANN at {} (`cargo xtask setup` builds it)",
                cann.display()
            ));
        }
        Ok(Bed {
            python,
            release: venv
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
            cann,
            script: repo.join("tests/fixtures/python/torch_npu_train.py"),
        })
    }

    /// The environment `set_env.sh` gives.
    fn env(&self, c: &mut Command) {
        let lib = self.cann.join("lib64");
        let path = match std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
            Some(old) => format!("{}:{}", lib.display(), old.to_string_lossy()),
            None => lib.display().to_string(),
        };
        c.env("ASCEND_HOME_PATH", &self.cann)
            .env("ASCEND_OPP_PATH", self.cann.join("opp"))
            .env("LD_LIBRARY_PATH", path);
    }

    /// The script's arguments: one step, held at READY until `go` exists.
    fn args(&self, c: &mut Command, log: &Path, go: &Path) {
        c.arg(&self.script)
            .arg("--log")
            .arg(log)
            .args(["--steps", "1", "--wait-file"])
            .arg(go);
    }
}

const LAUNCH: &str = "torch_launch";
const ATTACH: &str = "torch_pid_attach";

impl Bench {
    pub(super) fn harm_real_torch(&mut self, rounds: usize, md: &mut String) -> Result<()> {
        println!("{TAG}   the real PyTorch script (torch_npu test bed)");
        writeln!(md, "### The real PyTorch script\n")?;
        let bed = match Bed::find(&self.repo) {
            Ok(b) => b,
            Err(why) => {
                println!("{TAG}   skipped: {why}");
                writeln!(md, "Skipped: {why}.\n")?;
                return Ok(());
            }
        };
        let launch_rounds = if self.opts.quick { 2 } else { rounds };
        for round in 0..launch_rounds {
            // Alternating which goes first: the page cache and the machine's load hit both.
            let order = if round % 2 == 0 {
                [Probes::None, Probes::Scoped]
            } else {
                [Probes::Scoped, Probes::None]
            };
            for probes in order {
                let (ready_s, cpu_s) = self.torch_launch(&bed, probes)?;
                self.sample(SECTION, LAUNCH, probes.key(), round, "ready_s", ready_s);
                self.sample(SECTION, LAUNCH, probes.key(), round, "cpu_s", cpu_s);
            }
        }
        let attaches = if self.opts.quick { 3 } else { rounds.max(5) };
        self.torch_pid_attach(&bed, attaches)?;

        writeln!(
            md,
            "`{}` (torch + torch_npu from PyPI, unmodified) running `torch_npu_train.py` on the \
             simulated CANN; release build of the tracer.\n\n*Launch start-up*: from starting \
             the command (`python …` or `memscope-bpf -- python …`, the tracer's own start \
             included) to the script's `READY` line: `import torch, torch_npu`, device set, \
             first segment reserved. *CPU*: the Python process's user+system time at that \
             point (`/proc/PID/stat`: probes and stops it paid for count, other processes on \
             this shared machine do not). {launch_rounds} rounds, the order alternating; median \
             [min–max].\n",
            bed.release
        )?;
        writeln!(
            md,
            "| | no tracer | launch mode, per-process links | traced / untraced |\n|---|---:|---:|---:|"
        )?;
        for (metric, what) in [("ready_s", "wall s to READY"), ("cpu_s", "CPU s to READY")] {
            let untraced = self.values(SECTION, LAUNCH, Probes::None.key(), metric);
            let traced = self.values(SECTION, LAUNCH, Probes::Scoped.key(), metric);
            writeln!(
                md,
                "| {what} | {} | {} | {:.2}× |",
                self.cell(LAUNCH, Probes::None.key(), metric, secs),
                self.cell(LAUNCH, Probes::Scoped.key(), metric, secs),
                median(&traced) / median(&untraced)
            )?;
        }
        writeln!(
            md,
            "\n*`--pid` to \"attached\"* on the same script held at `READY` (its libraries \
             mapped: torch_cpu, torch_cuda, torch_npu, the nvidia-* libraries, the simulated \
             CANN), {attaches} attaches one after the other; the tracer's own debug lines split \
             it into the BPF load and the planning (maps scan, symbol lookups, torch_npu's \
             allocator report from its cache, links). Milliseconds, median [min–max].\n"
        )?;
        writeln!(
            md,
            "| configuration | to \"attached\" | BPF load | planning |\n|---|---:|---:|---:|"
        )?;
        let ms = |v: f64| format!("{v:.0}");
        writeln!(
            md,
            "| {} | {} | {} | {} |\n",
            Probes::Scoped.key(),
            self.cell(ATTACH, Probes::Scoped.key(), "to_attached_ms", ms),
            self.cell(ATTACH, Probes::Scoped.key(), "bpf_load_ms", ms),
            self.cell(ATTACH, Probes::Scoped.key(), "planning_ms", ms),
        )?;
        Ok(())
    }

    /// One launch of the script, untraced or under the tracer: (wall s to READY, the Python
    /// process's CPU s at READY).
    fn torch_launch(&self, bed: &Bed, probes: Probes) -> Result<(f64, f64)> {
        let dir = self.scratch.join("harm-torch-launch");
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        let (log, go) = (dir.join("gt.log"), dir.join("go"));
        let mut c = if probes == Probes::None {
            Command::new(&bed.python)
        } else {
            let mut c = self.tracer(probes, &dir.join("out"));
            c.env("MEMSCOPE_BPF_DETACH", "foreground")
                .arg("--")
                .arg(&bed.python);
            c
        };
        bed.env(&mut c);
        bed.args(&mut c, &log, &go);
        c.stdout(Stdio::null())
            .stderr(Stdio::piped())
            .stdin(Stdio::null());
        let started = Instant::now();
        let mut child = c.spawn().with_context(|| format!("cannot run {c:?}"))?;
        // The tracer's stderr is drained so it never blocks on a full pipe.
        let stderr = child.stderr.take();
        let drain = std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut e) = stderr {
                let _ = std::io::Read::read_to_string(&mut e, &mut text);
            }
            text
        });
        let deadline = started + Duration::from_secs(600);
        let pid = loop {
            if let Some(pid) = fs::read_to_string(&log).ok().and_then(|t| ready_pid(&t)) {
                break pid;
            }
            if let Some(status) = child.try_wait()? {
                bail!(
                    "the script ended before READY ({status}):\n{}",
                    drain.join().unwrap_or_default()
                );
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!("the script was not READY within 600 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let ready = started.elapsed().as_secs_f64();
        let cpu = process_cpu_s(pid).unwrap_or(f64::NAN);
        fs::write(&go, b"")?;
        let status = child.wait()?;
        let stderr = drain.join().unwrap_or_default();
        if !status.success() {
            bail!("`{c:?}` failed ({status}):\n{stderr}");
        }
        Ok((ready, cpu))
    }

    /// `--pid` on the script held at READY, `attaches` times.
    fn torch_pid_attach(&mut self, bed: &Bed, attaches: usize) -> Result<()> {
        let dir = self.scratch.join("harm-torch-pid");
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        let (log, go) = (dir.join("gt.log"), dir.join("go"));
        let mut c = Command::new(&bed.python);
        bed.env(&mut c);
        bed.args(&mut c, &log, &go);
        let mut target = c
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .stdin(Stdio::null())
            .spawn()
            .context("cannot start the torch script")?;
        let result = (|| -> Result<()> {
            let deadline = Instant::now() + Duration::from_secs(600);
            let pid = loop {
                if let Some(pid) = fs::read_to_string(&log).ok().and_then(|t| ready_pid(&t)) {
                    break pid;
                }
                if target.try_wait()?.is_some() || Instant::now() > deadline {
                    bail!("the torch script never became READY");
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            for round in 0..attaches {
                let out = dir.join("out");
                let _ = fs::remove_dir_all(&out);
                let mut c = self.tracer(Probes::Scoped, &out);
                c.env("MEMSCOPE_BPF_DETACH", "foreground").args([
                    "--log-level=debug",
                    "--pid",
                    &pid.to_string(),
                ]);
                let run = run_pid_tracer(c)?;
                let (lines, attached) = (run.lines, run.to_attached_ms);
                let key = Probes::Scoped.key();
                self.sample(SECTION, ATTACH, key, round, "to_attached_ms", attached);
                let number_after = |needle: &str| {
                    lines.iter().find_map(|l| {
                        let rest = &l[l.find(needle)? + needle.len()..];
                        rest.split_whitespace().next()?.parse::<f64>().ok()
                    })
                };
                if let Some(v) = number_after("BPF programs loaded in ") {
                    self.sample(SECTION, ATTACH, key, round, "bpf_load_ms", v);
                }
                if let Some(v) = lines
                    .iter()
                    .find(|l| l.contains(&format!("planned pid {pid} in ")))
                    .and_then(|l| {
                        let rest = &l[l.find(" in ")? + 4..];
                        rest.split_whitespace().next()?.parse::<f64>().ok()
                    })
                {
                    self.sample(SECTION, ATTACH, key, round, "planning_ms", v);
                }
            }
            Ok(())
        })();
        let _ = fs::write(&go, b"");
        let deadline = Instant::now() + Duration::from_secs(300);
        while target.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = target.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        result
    }
}

/// The pid of the script's `READY pid=P` line.
fn ready_pid(log: &str) -> Option<u32> {
    log.lines()
        .find_map(|l| l.strip_prefix("READY pid="))
        .and_then(|p| p.trim().parse().ok())
}

/// User + system CPU seconds of a process (`/proc/PID/stat` fields 14 and 15).
fn process_cpu_s(pid: u32) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: fields are counted after its closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / clock_ticks_per_s())
}

/// `getconf CLK_TCK` (xtask has no libc binding); 100 on every Linux we know of.
fn clock_ticks_per_s() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

fn secs(v: f64) -> String {
    format!("{v:.2}")
}
