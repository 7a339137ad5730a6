//! The `agent` section: the node agent's cost. `bench_loop --mode hal` (a) with no agent and
//! (b) under `memscope-bpf agent` (system-wide probes, default stack sampling), rounds
//! interleaved; and the agent's own CPU time (utime + stime of its process) over a paced run
//! at a fixed event rate.

use std::{
    fmt::Write as _,
    io::{Read, Write as _},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{Bench, Config, TAG, median, result_field, spread};

pub(super) fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut all = String::new();
    s.read_to_string(&mut all).ok()?;
    let status = all.split(' ').nth(1)?.parse().ok()?;
    Some((status, all.split_once("\r\n\r\n")?.1.to_string()))
}

/// utime + stime of a process in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    // Fields 14 and 15 of stat(5); `f` starts at field 3.
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|i| f.get(*i)?.parse::<f64>().ok())
        .sum();
    ticks / clock_ticks_per_second()
}

fn clock_ticks_per_second() -> f64 {
    let out = Command::new("getconf").arg("CLK_TCK").output();
    out.ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(100.0)
}

/// `memscope_agent_events_total` of the agent at `addr` (NaN when it cannot be read).
fn events_received(addr: &str) -> f64 {
    get(addr, "/metrics")
        .and_then(|(_, body)| {
            body.lines()
                .find_map(|l| l.strip_prefix("memscope_agent_events_total "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(f64::NAN)
}

struct Agent {
    child: Child,
    addr: String,
}

impl Agent {
    fn start(b: &Bench, extra: &[&str]) -> Result<Agent> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr = format!("127.0.0.1:{port}");
        let mut c = Command::new(&b.tracer);
        c.args(["agent", "--listen", &addr, "--log-level", "warn"])
            .args(extra);
        for lib in ["libascend_hal.so", "libms_tools_ext.so"] {
            c.arg("--lib").arg(b.lib.join(lib));
        }
        let child = c
            .env("MEMSCOPE_BPF_DETACH", "foreground")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .context("cannot start the agent")?;
        let agent = Agent { child, addr };
        let deadline = Instant::now() + Duration::from_secs(120);
        while get(&agent.addr, "/ready").map(|r| r.0) != Some(200) {
            if Instant::now() > deadline {
                bail!("the agent never became ready");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(agent)
    }

    fn stop(mut self) -> Result<()> {
        // kill(1): xtask has no libc dependency.
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        let status = self.child.wait()?;
        if !status.success() {
            bail!("the agent exited with {status}");
        }
        Ok(())
    }
}

impl Bench {
    pub(super) fn agent(&mut self) -> Result<()> {
        println!("{TAG} node agent");
        let iters = if self.opts.quick { 20_000 } else { 100_000 };
        let args: Vec<String> = vec![
            "--mode".into(),
            "hal".into(),
            "--iters".into(),
            iters.to_string(),
        ];
        // (key, name, agent options; None: no agent)
        let configs: [(&str, &str, Option<&[&str]>); 4] = [
            ("untraced", "no agent", None),
            (
                "single",
                "for reference: a single run (`memscope-bpf -- bench_loop`)",
                None,
            ),
            (
                "counters",
                "agent, `--stack-depth 0` (counters only)",
                Some(&["--stack-depth", "0"]),
            ),
            ("agent", "agent, default (sampled stacks)", Some(&[])),
        ];
        for round in 0..self.opts.rounds {
            for (key, _, extra) in configs {
                let agent = match extra {
                    Some(extra) => Some(Agent::start(self, extra)?),
                    None => None,
                };
                let config = if key == "single" {
                    Config::Memscope
                } else {
                    Config::Untraced
                };
                let out = self.run_workload(config, &args)?;
                if let Some(a) = agent {
                    a.stop()?;
                }
                let ns = result_field(&out.stdout, "ns_per_call").context("no RESULT")?;
                println!("{TAG}   round {round}: {key:9} {ns:>9.1} ns/call");
                self.sample("agent", "tight", key, round, "ns_per_call", ns);
            }
        }

        // CPU at a fixed event rate: the paced loop (host work between calls) for a fixed time.
        let secs = if self.opts.quick { 5 } else { 20 };
        let paced = paced_loop(secs);
        let paced_configs = [
            (
                "counters",
                "counters only (`--stack-depth 0`)",
                &["--stack-depth", "0"][..],
            ),
            ("agent", "default (sampled stacks)", &[][..]),
        ];
        // Rounds interleaved, medians: on a shared machine one run is not a measurement.
        for round in 0..self.opts.rounds {
            for (key, _, extra) in paced_configs {
                self.paced_run(key, extra, &paced, round)?;
            }
        }

        let mut md = String::new();
        writeln!(md, "## Node agent\n")?;
        writeln!(
            md,
            "`memscope-bpf agent` (system-wide probes on the fixture HAL and mstx, stacks for a \
             byte-weighted sample of allocations, default `--sample-bytes`, decided in BPF). `bench_loop --mode \
             hal --iters {iters}` (4 KiB `halMemAlloc` + `halMemFree`, each a traced call) alone \
             and with the agent running, {} round(s), configurations interleaved; median \
             (min-max). Unsampled calls copy no stack (BPF decides before the copy) and go \
             to user space in per-CPU batches, as all calls do with counters only; a sampled \
             one is sent on its own after its stack, which user space pairs with it by \
             thread and timestamp.\n",
            self.opts.rounds
        )?;
        writeln!(
            md,
            "| configuration | ns per call (min-max) | overhead ns/call |"
        )?;
        writeln!(md, "|---|---:|---:|")?;
        let base = median(&self.values("agent", "tight", "untraced", "ns_per_call"));
        for (key, name, _) in configs {
            let v = self.values("agent", "tight", key, "ns_per_call");
            let (lo, hi) = spread(&v);
            let m = median(&v);
            writeln!(
                md,
                "| {name} | {m:.1} ({lo:.1}-{hi:.1}) | {} |",
                if key == "untraced" {
                    "-".to_string()
                } else {
                    format!("{:.1}", m - base)
                }
            )?;
        }
        writeln!(
            md,
            "\nAgent CPU at a given event rate: `bench_loop --mode hal --seconds {secs} --work 8` \
             (host work between calls) under a fresh agent, {} round(s), the two agents \
             interleaved, median (min-max); each after a first 1 s run of the same \
             loop under the same agent (the agent loads a binary's debug information once, \
             when the first sampled stack in it comes: that run's CPU is the last column); \
             CPU = utime + stime of the agent's process over the run (the self-metric \
             `memscope_agent_cpu_seconds_total` counts from the agent's start). The agent is \
             system-wide: on a shared machine it also receives other processes' events, so \
             its CPU per event received is given too. Target: under 5% of one CPU at 10^5 \
             calls/s (0.5 us per call).\n",
            self.opts.rounds
        )?;
        writeln!(
            md,
            "| agent | traced calls/s | % of one CPU | **CPU us per traced call** (min-max) | \
             CPU us per event received | self-metric at the end | first 1 s run: CPU s |"
        )?;
        writeln!(md, "|---|---:|---:|---:|---:|---:|---:|")?;
        for (key, name, _) in paced_configs {
            let m = |metric| median(&self.values("agent", "paced", key, metric));
            let per_call = self.values("agent", "paced", key, "cpu_us_per_call");
            let (lo, hi) = spread(&per_call);
            writeln!(
                md,
                "| {name} | {:.0} | {:.1}% | **{:.2}** ({lo:.2}-{hi:.2}) | {:.2} | {:.2} s | {:.2} |",
                m("calls_per_s"),
                100.0 * m("cpu_share"),
                median(&per_call),
                m("cpu_us_per_event"),
                m("self_metric_s"),
                m("first_run_cpu_s"),
            )?;
        }
        writeln!(md)?;
        self.md.push_str(&md);
        let path = self.repo.join("docs/benchmarks-agent.md");
        let mut doc = String::from(
            "# Benchmarks: the node agent\n\nWritten by `cargo xtask bench --only agent",
        );
        if self.opts.quick {
            doc.push_str(" --quick");
        }
        doc.push('`');
        writeln!(
            doc,
            " on {} (kernel {}, load average {} at the end). Times are for this machine only; \
             docs/benchmark-notes.md has the side-by-side comparisons of builds.\n",
            super::harm::chrono_like_now(),
            super::harm::kernel_release(),
            load_average()
        )?;
        doc.push_str(&md);
        std::fs::write(&path, doc)?;
        println!("{TAG} wrote {}", path.display());
        Ok(())
    }

    /// One paced run under a fresh agent: its CPU per traced call and per event received.
    fn paced_run(
        &mut self,
        key: &'static str,
        extra: &[&str],
        paced: &[String],
        round: usize,
    ) -> Result<()> {
        let agent = Agent::start(self, extra)?;
        let pid = agent.child.id();
        // A first, short run of the same loop: the agent loads the loop binary's debug
        // information once per file (when its first sampled stack comes), a one-time cost
        // shown apart; the measured run is then the steady state of a known binary.
        let warm_cpu0 = cpu_seconds(pid);
        self.run_workload(Config::Untraced, &paced_loop(1))?;
        let warm_cpu = cpu_seconds(pid) - warm_cpu0;
        // The agent is system-wide: events of other processes on the machine count too,
        // so its CPU is also given per event it received.
        let events0 = events_received(&agent.addr);
        let cpu0 = cpu_seconds(pid);
        let t0 = Instant::now();
        let out = self.run_workload(Config::Untraced, paced)?;
        let wall = t0.elapsed().as_secs_f64();
        let cpu = cpu_seconds(pid) - cpu0;
        let events = events_received(&agent.addr) - events0;
        let metrics = get(&agent.addr, "/metrics")
            .map(|r| r.1)
            .unwrap_or_default();
        agent.stop()?;
        let calls = result_field(&out.stdout, "calls").unwrap_or(f64::NAN);
        let elapsed = result_field(&out.stdout, "elapsed_ns").unwrap_or(f64::NAN) / 1e9;
        let rate = calls / elapsed;
        let self_metric = metrics
            .lines()
            .find_map(|l| l.strip_prefix("memscope_agent_cpu_seconds_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(f64::NAN);
        let us_per_event = 1e6 * cpu / events;
        let us_per_call = 1e6 * cpu / calls;
        println!(
            "{TAG}   round {round}: paced, {key}: {rate:.0} calls/s for {wall:.1} s; agent CPU \
             {cpu:.2} s ({:.1}% of one CPU, {us_per_call:.2} us per traced call), {events:.0} \
             events received, {us_per_event:.2} us each; first 1 s run: {warm_cpu:.2} s",
            100.0 * cpu / wall
        );
        self.sample("agent", "paced", key, round, "calls_per_s", rate);
        self.sample("agent", "paced", key, round, "cpu_share", cpu / wall);
        self.sample(
            "agent",
            "paced",
            key,
            round,
            "cpu_us_per_event",
            us_per_event,
        );
        self.sample("agent", "paced", key, round, "cpu_us_per_call", us_per_call);
        self.sample("agent", "paced", key, round, "self_metric_s", self_metric);
        self.sample("agent", "paced", key, round, "first_run_cpu_s", warm_cpu);
        Ok(())
    }
}

/// The 1-minute load average (the machine may be shared).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// `bench_loop`'s arguments for the paced HAL loop (host work between calls) run for `secs`.
fn paced_loop(secs: u64) -> Vec<String> {
    [
        "--mode",
        "hal",
        "--seconds",
        &secs.to_string(),
        "--work",
        "8",
    ]
    .map(String::from)
    .to_vec()
}
