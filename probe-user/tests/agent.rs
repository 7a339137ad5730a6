//! The node agent (`memscope-bpf agent`) end to end: workloads started after the agent are
//! picked up, and what its endpoints say is checked against each workload's own ground-truth
//! log, against a real Prometheus server's PromQL answers, and against `go tool pprof`.

mod common;

use std::{
    collections::{BTreeMap, HashMap},
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::{agent::samples, *};

/// A fixture log replayed in order: (device, owner) -> bytes live at the end, and device ->
/// the highest total live bytes after any one operation. Driver blocks (`MALLOC`/`FREE`,
/// module 33 = CANN@APP) and pool regions (`REGION_MALLOC`/`REGION_FREE`).
fn replay(log: &Path) -> (BTreeMap<(String, String), u64>, BTreeMap<String, u64>) {
    let text = std::fs::read_to_string(log).unwrap();
    let mut live: HashMap<(String, u64), (String, String, u64)> = HashMap::new();
    let mut total: HashMap<String, u64> = HashMap::new();
    let mut peak: BTreeMap<String, u64> = BTreeMap::new();
    for line in text.lines() {
        let f = log_fields(line);
        let (kind, _) = line.split_once(' ').unwrap_or((line, ""));
        let owner = match (kind, f.get("pool").copied()) {
            ("MALLOC" | "FREE", _) => "CANN@APP".to_string(),
            ("REGION_MALLOC" | "REGION_FREE", Some("ptaCaching")) => "PTA".to_string(),
            ("REGION_MALLOC" | "REGION_FREE", Some(p)) => panic!("pool {p} not expected here"),
            _ => continue,
        };
        let layer = if kind.starts_with("REGION") {
            "pool"
        } else {
            "hal"
        };
        let key = (layer.to_string(), hex(f["addr"]));
        if kind.ends_with("MALLOC") {
            let size: u64 = f["size"].parse().unwrap();
            let dev = f["dev"].to_string();
            let t = total.entry(dev.clone()).or_default();
            *t += size;
            let p = peak.entry(dev.clone()).or_default();
            *p = (*p).max(*t);
            live.insert(key, (dev, owner, size));
        } else if let Some((dev, _, size)) = live.remove(&key) {
            *total.get_mut(&dev).unwrap() -= size;
        }
    }
    let mut by = BTreeMap::new();
    for (dev, owner, size) in live.into_values() {
        *by.entry((dev, owner)).or_default() += size;
    }
    (by, peak)
}

/// (device, owner) -> bytes live at the end of a fixture log.
fn live_at_end(log: &Path) -> BTreeMap<(String, String), u64> {
    replay(log).0
}

/// One HTTP GET against the agent: (status, body).
fn get(addr: &str, path: &str) -> Option<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut all = Vec::new();
    s.read_to_end(&mut all).ok()?;
    let split = all.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&all[..split]).into_owned();
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, all[split + 4..].to_vec()))
}

/// A free loopback port (bound and released; nothing else on the machine picks ports here).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Agent {
    /// None once stopped.
    bg: Option<Background>,
    addr: String,
}

/// A system-wide tracer must not outlive a failed test.
impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(bg) = self.bg.take() {
            // SAFETY: plain kill(2) on our child.
            unsafe { libc::kill(bg.child.id() as i32, libc::SIGTERM) };
            let _ = bg.finish();
        }
    }
}

/// Kills a helper process (Prometheus) however the test ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Agent {
    fn start(extra: &[&str]) -> Agent {
        let lib = fixtures().join("lib");
        let libs: Vec<String> = ["libascend_hal.so", "libms_tools_ext.so", "libascendcl.so"]
            .iter()
            .map(|l| lib.join(l).display().to_string())
            .collect();
        let mut args = vec!["--lib", &libs[0], "--lib", &libs[1], "--lib", &libs[2]];
        args.extend_from_slice(extra);
        Agent::start_without_libs(&args)
    }

    /// An agent that finds the libraries in the processes' maps and opens.
    fn start_without_libs(extra: &[&str]) -> Agent {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut args = vec!["agent", "--listen", &addr, "--snapshot-ms", "200"];
        args.extend_from_slice(extra);
        let bg = Background::spawn(&args);
        let agent = Agent { bg: Some(bg), addr };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some((200, _)) = get(&agent.addr, "/ready") {
                break;
            }
            assert!(Instant::now() < deadline, "agent never became ready");
            std::thread::sleep(Duration::from_millis(100));
        }
        agent
    }

    fn metrics(&self) -> Vec<(String, BTreeMap<String, String>, f64)> {
        let (status, body) = get(&self.addr, "/metrics").expect("GET /metrics");
        assert_eq!(status, 200);
        samples(&String::from_utf8(body).unwrap())
    }

    /// Waits until every pid's final state (after its exit) is in /metrics.
    fn wait_exited(&self, pids: &[u32]) -> Vec<(String, BTreeMap<String, String>, f64)> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let m = self.metrics();
            let done = pids.iter().all(|pid| {
                m.iter().any(|(n, l, v)| {
                    n == "memscope_process_exited" && l["pid"] == pid.to_string() && *v == 1.0
                })
            });
            if done {
                return m;
            }
            assert!(
                Instant::now() < deadline,
                "the agent never reported the exit of {pids:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn stop(mut self) -> String {
        let bg = self.bg.take().expect("running");
        // SAFETY: plain kill(2) on our child.
        unsafe { libc::kill(bg.child.id() as i32, libc::SIGTERM) };
        let (code, stderr) = bg.finish();
        assert_eq!(code, Some(0), "agent exit status; stderr:\n{stderr}");
        stderr
    }
}

/// Runs a fixture program to its end with `--log`; returns its pid.
fn run_workload(name: &str, args: &[&str], log: &Path) -> u32 {
    let out = Command::new(bin(name))
        .args(args)
        .arg("--log")
        .arg(log)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "{name} failed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("PID "))
        .and_then(|p| p.trim().parse().ok())
        .expect("PID line")
}

fn live_metrics(
    m: &[(String, BTreeMap<String, String>, f64)],
    pid: u32,
) -> BTreeMap<(String, String), u64> {
    m.iter()
        .filter(|(n, l, _)| n == "memscope_live_bytes" && l["pid"] == pid.to_string())
        .map(|(_, l, v)| ((l["device"].clone(), l["owner"].clone()), *v as u64))
        .filter(|(_, v)| *v > 0)
        .collect()
}

fn metric(m: &[(String, BTreeMap<String, String>, f64)], name: &str, pid: u32) -> f64 {
    m.iter()
        .find(|(n, l, _)| n == name && l.get("pid") == Some(&pid.to_string()))
        .map(|(_, _, v)| *v)
        .unwrap_or_else(|| panic!("no {name} for pid {pid}"))
}

struct Workloads {
    leaky: (u32, PathBuf),
    clean: (u32, PathBuf),
    pool: (u32, PathBuf),
}

fn run_workloads(dir: &Path) -> Workloads {
    let leaky_log = dir.join("leaky.log");
    let leaky = run_workload(
        "workload",
        &[
            "--threads",
            "2",
            "--devices",
            "2",
            "--steps",
            "5",
            "--allocs",
            "3",
            "--leaks",
            "1",
        ],
        &leaky_log,
    );
    let clean_log = dir.join("clean.log");
    let clean = run_workload(
        "workload",
        &["--steps", "5", "--allocs", "3", "--leaks", "0"],
        &clean_log,
    );
    let pool_log = dir.join("pool.log");
    let pool = run_workload(
        "pool_workload",
        &[
            "--pool",
            "pta",
            "--devices",
            "2",
            "--steps",
            "5",
            "--blocks",
            "4",
            "--leak-from-step",
            "0",
        ],
        &pool_log,
    );
    Workloads {
        leaky: (leaky, leaky_log),
        clean: (clean, clean_log),
        pool: (pool, pool_log),
    }
}

#[test]
fn agent_metrics_match_each_workloads_log_and_flag_only_the_leak() {
    if !require_root("agent_metrics_match_each_workloads_log_and_flag_only_the_leak") {
        return;
    }
    let _g = serial();
    let dir = scratch("agent-metrics");
    // Every stack kept, so the profile below holds every allocation as itself.
    let agent = Agent::start(&["--sample-bytes", "0"]);
    let w = run_workloads(&dir);
    let m = agent.wait_exited(&[w.leaky.0, w.clean.0, w.pool.0]);

    for (pid, log) in [&w.leaky, &w.clean, &w.pool] {
        let want = live_at_end(log);
        assert_eq!(
            live_metrics(&m, *pid),
            want,
            "live bytes by (device, owner) of pid {pid} vs {}",
            log.display()
        );
    }
    // Peaks are exact, per event: the highest sum of live blocks the log ever reached on each
    // device (the workloads free within a step, so no snapshot would see these).
    for (pid, log) in [&w.leaky, &w.clean, &w.pool] {
        let peaks: BTreeMap<String, u64> = m
            .iter()
            .filter(|(n, l, _)| n == "memscope_peak_bytes" && l["pid"] == pid.to_string())
            .map(|(_, l, v)| (l["device"].clone(), *v as u64))
            .collect();
        assert_eq!(peaks, replay(log).1, "peak per device of pid {pid}");
    }
    // The leaky run leaks one block per thread per step, on devices 0 and 1.
    assert_eq!(
        live_at_end(&w.leaky.1)
            .keys()
            .map(|k| k.0.as_str())
            .collect::<Vec<_>>(),
        ["0", "1"]
    );
    assert!(live_at_end(&w.clean.1).is_empty());
    assert_eq!(metric(&m, "memscope_leak_suspected", w.leaky.0), 1.0);
    assert_eq!(metric(&m, "memscope_leak_suspected", w.clean.0), 0.0);
    // The pool's segments and unfreed-by-design regions of step 0 are no leak.
    assert_eq!(metric(&m, "memscope_leak_suspected", w.pool.0), 0.0);
    // With --leak-steps 3 and 5 steps, the blocks of steps 1 and 2 are suspects: 2 threads x
    // 2 steps, sizes from the log.
    let gt = parse_log(&w.leaky.1);
    let suspect_bytes: u64 = gt
        .of("LEAK")
        .iter()
        .filter(|b| b.step <= 2)
        .map(|b| b.size)
        .sum();
    let got: f64 = m
        .iter()
        .filter(|(n, l, _)| n == "memscope_leak_suspect_bytes" && l["pid"] == w.leaky.0.to_string())
        .map(|(_, _, v)| v)
        .sum();
    assert_eq!(got as u64, suspect_bytes);
    // Exact counters.
    let s = &gt.summary;
    assert_eq!(
        metric(&m, "memscope_allocations_total", w.leaky.0) as u64,
        s["mallocs"]
    );
    assert_eq!(
        metric(&m, "memscope_frees_total", w.leaky.0) as u64,
        s["frees"]
    );
    let cpu = m
        .iter()
        .find(|(n, _, _)| n == "memscope_agent_cpu_seconds_total")
        .map(|(_, _, v)| *v)
        .expect("self-metric of the agent's CPU time");
    assert!(cpu > 0.0, "the agent used no CPU? {cpu}");
    // These workloads never fill the unwinder's backlog (unit test: events::stacks).
    let dropped = m
        .iter()
        .find(|(n, _, _)| n == "memscope_agent_dropped_stacks_total")
        .map(|(_, _, v)| *v)
        .expect("self-metric of the stacks dropped behind the unwinder");
    assert_eq!(dropped, 0.0);

    // pprof: the heap of the leaky process.
    let (status, body) =
        get(&agent.addr, &format!("/debug/pprof/heap?pid={}", w.leaky.0)).expect("GET heap");
    assert_eq!(status, 200);
    assert_eq!(&body[..2], [0x1f, 0x8b], "gzipped");
    std::fs::write(dir.join("leaky.pb.gz"), &body).unwrap();
    let (status, _) = get(&agent.addr, "/debug/pprof/heap?pid=1").unwrap();
    assert_eq!(status, 404);

    let stderr = agent.stop();
    for pid in [w.leaky.0, w.clean.0, w.pool.0] {
        assert!(
            stderr.contains(&format!("picked up pid {pid} ")),
            "no pick-up line for {pid}:\n{stderr}"
        );
        assert!(
            stderr.contains(&format!("lost pid {pid} ")),
            "no exit line for {pid}:\n{stderr}"
        );
    }
}

/// `go tool pprof -top` on a profile file: (flat, cum, function) rows in the order printed.
fn pprof_top(profile: &Path, extra: &[&str]) -> Vec<(u64, u64, String)> {
    let out = Command::new("go")
        .args([
            "tool",
            "pprof",
            "-top",
            "-unit=B",
            "-sample_index=inuse_space",
        ])
        .args(extra)
        .arg(profile)
        .output()
        .expect("run `go tool pprof` (Debian golang-go; `cargo xtask setup` installs it)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "go tool pprof failed: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = |s: &str| s.trim_end_matches('B').parse::<u64>().ok();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // flat flat% sum% cum cum% name...
            if f.len() < 6 {
                return None;
            }
            Some((bytes(f[0])?, bytes(f[3])?, f[5..].join(" ")))
        })
        .collect()
}

/// Starts a fixture program that holds before its steps (`--pre-allocs 1 --wait-file`) until
/// the agent has picked it up, so its stacks are resolved while it lives; returns its pid.
fn run_gated(agent: &Agent, name: &str, args: &[&str], log: &Path) -> u32 {
    use std::io::BufRead;
    let go = log.with_extension("go");
    let release = GoOnDrop(go.clone());
    let mut child = Command::new(bin(name))
        .args(args)
        .args(["--pre-allocs", "1", "--wait-file"])
        .arg(&go)
        .arg("--log")
        .arg(log)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pid: u32 = line.trim().strip_prefix("PID ").unwrap().parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !agent
        .metrics()
        .iter()
        .any(|(n, l, _)| n == "memscope_live_bytes" && l["pid"] == pid.to_string())
    {
        assert!(Instant::now() < deadline, "the agent never picked up {pid}");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(release);
    assert!(child.wait().unwrap().success(), "{name} failed");
    pid
}

#[test]
fn go_pprof_reads_the_heap_profile_with_sites_in_order_of_in_use_bytes() {
    if !require_root("go_pprof_reads_the_heap_profile_with_sites_in_order_of_in_use_bytes") {
        return;
    }
    let _g = serial();
    let dir = scratch("agent-pprof");
    let export = dir.join("export.pb.gz");
    let export_arg = export.display().to_string();
    let agent = Agent::start(&["--sample-bytes", "0", "--heap-profile-out", &export_arg]);
    // Two processes of the same program: the leaks of the worker threads (`thread_main`) and
    // the block `main` allocates before its steps and frees after the wait.
    let (big_log, small_log) = (dir.join("big.log"), dir.join("small.log"));
    let big = run_gated(
        &agent,
        "workload",
        &[
            "--threads",
            "2",
            "--devices",
            "2",
            "--steps",
            "5",
            "--allocs",
            "3",
            "--leaks",
            "2",
        ],
        &big_log,
    );
    let small = run_gated(
        &agent,
        "workload",
        &["--steps", "5", "--allocs", "3", "--leaks", "1"],
        &small_log,
    );
    agent.wait_exited(&[big, small]);
    let (status, body) = get(&agent.addr, "/debug/pprof/heap").expect("GET heap");
    assert_eq!(status, 200);
    let node = dir.join("node.pb.gz");
    std::fs::write(&node, &body).unwrap();
    let (status, body) =
        get(&agent.addr, &format!("/debug/pprof/heap?pid={small}")).expect("GET heap?pid");
    assert_eq!(status, 200);
    let one = dir.join("small.pb.gz");
    std::fs::write(&one, &body).unwrap();
    agent.stop();

    let in_use = |log: &Path| -> u64 { live_at_end(log).values().sum() };
    let (big_bytes, small_bytes) = (in_use(&big_log), in_use(&small_log));
    assert!(big_bytes > small_bytes && small_bytes > 0);
    // The agent sees every process on the machine (other tests may run workloads too): look
    // at ours.
    let focus = format!("-focus=^workload \\(pid ({big}|{small})\\)$");
    let top = pprof_top(&node, &["-cum", "-sample_index=inuse_space", &focus]);
    let cum_of = |top: &[(u64, u64, String)], name: &str| -> (usize, u64) {
        top.iter()
            .position(|(_, _, n)| n == name)
            .map(|i| (i, top[i].1))
            .unwrap_or_else(|| panic!("{name} not in pprof -top:\n{top:?}"))
    };
    let big_root = cum_of(&top, &format!("workload (pid {big})"));
    let small_root = cum_of(&top, &format!("workload (pid {small})"));
    assert_eq!(big_root.1, big_bytes);
    assert_eq!(small_root.1, small_bytes);
    assert!(big_root.0 < small_root.0, "{top:?}");
    // Every leaked block came from the worker threads, through the workload's `do_alloc`
    // (the stack's innermost frame is the caller of the probed `halMemAlloc`).
    assert_eq!(cum_of(&top, "thread_main").1, big_bytes + small_bytes);
    let flat: Vec<&(u64, u64, String)> = top.iter().filter(|(f, _, _)| *f > 0).collect();
    assert_eq!(
        flat,
        [&(
            big_bytes + small_bytes,
            big_bytes + small_bytes,
            "do_alloc".to_string()
        )]
    );
    assert_eq!(cum_of(&top, "do_alloc").1, big_bytes + small_bytes);
    // The block main allocated before the wait is freed: no in-use bytes there, but 1 MiB
    // allocated per process.
    let alloc = pprof_top(&node, &["-cum", "-sample_index=alloc_space", &focus]);
    let main_alloc = cum_of(&alloc, "main").1;
    assert_eq!(main_alloc, 2 << 20, "{alloc:?}");
    let all_allocated =
        |log: &Path| -> u64 { parse_log(log).of("MALLOC").iter().map(|b| b.size).sum() };
    assert_eq!(
        cum_of(&alloc, "do_alloc").1,
        all_allocated(&big_log) + all_allocated(&small_log)
    );
    // Each sample is tagged with its site: the line that called the allocator wrapper
    // `do_alloc` in `thread_main` (workload.c:250) holds every in-use byte.
    let tags = Command::new("go")
        .args([
            "tool",
            "pprof",
            "-tags",
            "-sample_index=inuse_space",
            &focus,
        ])
        .arg(&node)
        .output()
        .expect("run go tool pprof -tags");
    let tags = String::from_utf8_lossy(&tags.stdout);
    assert!(
        tags.lines()
            .any(|l| l.contains("(  100%)") && l.trim_end().ends_with("/workload.c:250")),
        "{tags}"
    );
    // One process's profile holds that process only.
    let top_one = pprof_top(&one, &["-cum", "-sample_index=inuse_space"]);
    assert_eq!(
        cum_of(&top_one, &format!("workload (pid {small})")).1,
        small_bytes
    );
    assert!(!top_one.iter().any(|(_, _, n)| n.contains(&big.to_string())));
    // The file written at shutdown (--heap-profile-out) is the same profile.
    let exported = pprof_top(&export, &["-cum", "-sample_index=inuse_space", &focus]);
    let roots = |t: &[(u64, u64, String)]| -> Vec<(u64, String)> {
        t.iter()
            .filter(|(_, _, n)| n.contains("(pid "))
            .map(|(_, c, n)| (*c, n.clone()))
            .collect()
    };
    assert_eq!(roots(&exported), roots(&top));
}

/// With stacks sampled in BPF (`--sample-bytes R`), the heap profile's in-use bytes are an
/// estimate: each sampled block weighs `1 / p(s)`, `p(s) = 1 - exp(-s / R)`. It must match the
/// workload's log within a bound from the estimate's own variance, `sum s^2 (1 - p) / p` over
/// the blocks live at the end; and only a sample of the blocks may carry a stack.
#[test]
fn sampled_heap_profile_estimates_the_in_use_bytes_without_bias() {
    if !require_root("sampled_heap_profile_estimates_the_in_use_bytes_without_bias") {
        return;
    }
    let _g = serial();
    let dir = scratch("agent-sampled");
    let mean: u64 = 32 << 20;
    let agent = Agent::start(&["--sample-bytes", &mean.to_string()]);
    // Blocks of 1..16 MiB (+ 4 KiB per thread), all leaked: 1280 live blocks, ~11 GiB.
    let log = dir.join("sampled.log");
    let pid = run_gated(
        &agent,
        "workload",
        &[
            "--threads",
            "2",
            "--devices",
            "2",
            "--steps",
            "40",
            "--allocs",
            "16",
            "--leaks",
            "16",
        ],
        &log,
    );
    agent.wait_exited(&[pid]);
    let (status, body) =
        get(&agent.addr, &format!("/debug/pprof/heap?pid={pid}")).expect("GET heap?pid");
    assert_eq!(status, 200);
    let profile = dir.join("sampled.pb.gz");
    std::fs::write(&profile, &body).unwrap();
    agent.stop();

    // The log replayed in order (an address is reused once freed).
    let mut live_blocks: HashMap<u64, u64> = HashMap::new();
    for line in std::fs::read_to_string(&log).unwrap().lines() {
        let f = log_fields(line);
        match line.split_once(' ').map(|(k, _)| k) {
            Some("MALLOC") => live_blocks.insert(hex(f["addr"]), f["size"].parse().unwrap()),
            Some("FREE") => live_blocks.remove(&hex(f["addr"])),
            _ => None,
        };
    }
    let live: Vec<u64> = live_blocks.into_values().collect();
    assert_eq!(live.len(), 2 * 40 * 16);
    let truth: u64 = live.iter().sum();
    let p = |s: u64| 1.0 - (-(s as f64) / mean as f64).exp();
    let variance: f64 = live
        .iter()
        .map(|s| (*s as f64).powi(2) * (1.0 - p(*s)) / p(*s))
        .sum();
    let sd = variance.sqrt();
    let top = pprof_top(&profile, &["-cum", "-sample_index=inuse_space"]);
    let root = format!("workload (pid {pid})");
    let estimate = top
        .iter()
        .find(|(_, _, n)| *n == root)
        .unwrap_or_else(|| panic!("{root} not in pprof -top:\n{top:?}"))
        .1 as f64;
    eprintln!(
        "sampled in-use estimate {estimate} vs {truth} in the log ({:+.2} sd, sd {sd:.0})",
        (estimate - truth as f64) / sd
    );
    // 5 standard deviations: a correct sampler fails about once in two million runs.
    assert!(
        (estimate - truth as f64).abs() < 5.0 * sd,
        "in-use estimate {estimate} vs {truth} in the log (sd {sd:.0})"
    );
    // The block count is estimated the same way (variance sum (1 - p) / p); with every block
    // kept and weighed anyway, both estimates would be several times the truth, and an
    // estimate equal to the log to the byte would mean nothing was left out.
    let objects = pprof_top(&profile, &["-cum", "-sample_index=inuse_objects"]);
    let count = objects
        .iter()
        .find(|(_, _, n)| *n == root)
        .map(|r| r.1 as f64)
        .unwrap_or(0.0);
    let count_sd: f64 = live
        .iter()
        .map(|s| (1.0 - p(*s)) / p(*s))
        .sum::<f64>()
        .sqrt();
    assert!(
        (count - live.len() as f64).abs() < 5.0 * count_sd,
        "in-use block estimate {count} vs {} (sd {count_sd:.0})",
        live.len()
    );
    assert_ne!(
        estimate as u64, truth,
        "every block has a stack: not sampled"
    );
    // The sampled stacks are still right: every leaked block was allocated in `do_alloc`,
    // the only frame with in-use bytes of its own.
    let flat: Vec<&(u64, u64, String)> = top.iter().filter(|(f, _, _)| *f > 0).collect();
    assert_eq!(flat.len(), 1, "{top:?}");
    assert_eq!(flat[0].2, "do_alloc");
    assert_eq!(flat[0].0 as f64, estimate);
}

/// A real Prometheus server (Debian `prometheus`) scrapes the agent every second; PromQL over
/// its TSDB gives each workload's live bytes per device and owner.
#[test]
fn prometheus_scrapes_the_agent_and_promql_returns_the_live_bytes() {
    if !require_root("prometheus_scrapes_the_agent_and_promql_returns_the_live_bytes") {
        return;
    }
    let _g = serial();
    let dir = scratch("agent-prometheus");
    let agent = Agent::start(&[]);
    let prom_addr = format!("127.0.0.1:{}", free_port());
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: memscope\n    static_configs:\n      - targets: ['{}']\n",
            agent.addr
        ),
    )
    .unwrap();
    let _prom = KillOnDrop(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={prom_addr}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "start prometheus (Debian package prometheus; `cargo xtask setup` installs it)",
            ),
    );
    let w = run_workloads(&dir);
    agent.wait_exited(&[w.leaky.0, w.pool.0]);

    let query = |q: &str| -> Vec<(BTreeMap<String, String>, f64)> {
        let enc: String = q
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect();
        let Some((200, body)) = get(&prom_addr, &format!("/api/v1/query?query={enc}")) else {
            return Vec::new();
        };
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        v["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|r| {
                let labels = r["metric"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                    .collect();
                (labels, r["value"][1].as_str().unwrap().parse().unwrap())
            })
            .collect()
    };
    for (pid, log) in [&w.leaky, &w.pool] {
        let want = live_at_end(log);
        let q = format!("sum by (device, owner) (memscope_live_bytes{{pid=\"{pid}\"}})");
        let deadline = Instant::now() + Duration::from_secs(90);
        let got = loop {
            let got: BTreeMap<(String, String), u64> = query(&q)
                .into_iter()
                .map(|(l, v)| ((l["device"].clone(), l["owner"].clone()), v as u64))
                .collect();
            if got == want || Instant::now() > deadline {
                break got;
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        assert_eq!(got, want, "PromQL {q} vs {}", log.display());
    }
    let flagged = query("memscope_leak_suspected == 1");
    let pids: Vec<&str> = flagged.iter().map(|(l, _)| l["pid"].as_str()).collect();
    assert!(pids.contains(&w.leaky.0.to_string().as_str()), "{pids:?}");
    assert!(!pids.contains(&w.pool.0.to_string().as_str()), "{pids:?}");
    agent.stop();
}

#[test]
fn agent_usage_errors_and_help() {
    let out = run_tracer(&["agent", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "--listen",
        "--sample-bytes",
        "/metrics",
        "/debug/pprof/heap",
        "SIGTERM",
    ] {
        assert!(help.contains(needle), "help lacks {needle}:\n{help}");
    }
    for (args, needle) in [
        (&["agent", "--listen", "localhost"][..], "expected IP:PORT"),
        (&["agent", "--bogus"][..], "unknown agent option '--bogus'"),
        (&["agent", "--pid", "1"][..], "unknown agent option '--pid'"),
        (
            &["agent", "--lib", "/nonexistent/libascend_hal.so"][..],
            "not a file",
        ),
    ] {
        let out = run_tracer(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    // A port already taken: the agent says so before loading anything, exit 1.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = run_tracer(&["agent", "--listen", &addr]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on {addr}")),
        "{stderr}"
    );
}

/// The agent traces every process on the host but never signals one: a process someone else
/// stopped stays stopped across the agent's start and SIGTERM.
#[test]
fn agent_leaves_a_stopped_process_stopped() {
    if !require_root("agent_leaves_a_stopped_process_stopped") {
        return;
    }
    let _g = serial();
    let sleeper = KillOnDrop(Command::new("sleep").arg("120").spawn().unwrap());
    let pid = sleeper.0.id();
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while process_state(pid) != Some('T') {
        assert!(Instant::now() < deadline, "sleep never stopped");
        std::thread::sleep(Duration::from_millis(10));
    }
    let agent = Agent::start(&[]);
    assert_eq!(process_state(pid), Some('T'));
    agent.stop();
    assert_eq!(
        process_state(pid),
        Some('T'),
        "the agent resumed a process it did not stop"
    );
}

/// A job already running when the agent starts is found through its mappings (no `--lib`):
/// what it does from then on is counted.
#[test]
fn agent_picks_up_a_job_that_was_running_before_it() {
    if !require_root("agent_picks_up_a_job_that_was_running_before_it") {
        return;
    }
    let _g = serial();
    let dir = scratch("agent-existing");
    let log = dir.join("existing.log");
    let go = dir.join("go");
    let release = GoOnDrop(go.clone());
    let mut child = Command::new(bin("workload"))
        .args([
            "--devices",
            "2",
            "--threads",
            "2",
            "--steps",
            "4",
            "--allocs",
            "2",
        ])
        .args(["--leaks", "1", "--pre-allocs", "1", "--wait-file"])
        .arg(&go)
        .arg("--log")
        .arg(&log)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let pid: u32 = line.trim().strip_prefix("PID ").unwrap().parse().unwrap();
    let agent = Agent::start_without_libs(&[]);
    drop(release);
    assert!(child.wait().unwrap().success());
    let m = agent.wait_exited(&[pid]);
    // The block allocated before the agent started was freed after: that free matches nothing.
    let want = live_at_end(&log);
    assert_eq!(
        want.keys().map(|k| k.0.as_str()).collect::<Vec<_>>(),
        ["0", "1"]
    );
    assert_eq!(live_metrics(&m, pid), want);
    assert_eq!(metric(&m, "memscope_leak_suspected", pid), 1.0);
    let stderr = agent.stop();
    assert!(stderr.contains("libascend_hal.so"), "{stderr}");
}

/// The released torch + torch_npu wheels on the simulated CANN (tests/fixtures/python/
/// torch_npu_train.py, started after the agent, which is given only the CANN install's
/// libraries: libtorch_npu.so's reporting function is found when the job opens it). While the
/// job holds its tensors after `empty_cache()`, /metrics says what the job itself printed:
/// PTA live bytes = `memory_allocated()`, CANN (driver) live bytes = `memory_reserved()`;
/// and the heap profile's stacks go through the script's own Python functions.
#[test]
fn agent_reports_a_real_torch_npu_job_by_owner_with_python_frames() {
    const TEST: &str = "agent_reports_a_real_torch_npu_job_by_owner_with_python_frames";
    if !require_root(TEST) {
        return;
    }
    let Some(venvs) = torch_venvs(TEST) else {
        return;
    };
    let _g = serial();
    let lib64 = cann_dir().join("lib64");
    let libs: Vec<String> = ["libascend_hal.so", "libascendcl.so"]
        .iter()
        .map(|l| lib64.join(l).display().to_string())
        .collect();
    let agent =
        Agent::start_without_libs(&["--lib", &libs[0], "--lib", &libs[1], "--sample-bytes", "0"]);
    let script = torch_script();
    for venv in venvs {
        let release = bed_release(&venv);
        let dir = scratch(&format!("agent-torch-{release}"));
        let (log, go, hold) = (dir.join("gt.log"), dir.join("go"), dir.join("hold"));
        let _release_hold = GoOnDrop(hold.clone());
        let _release_go = GoOnDrop(go.clone());
        let mut job = KillOnDrop(
            Command::new(venv.join("bin/python"))
                .arg(&script)
                .arg("--log")
                .arg(&log)
                .args(["--steps", "5", "--wait-file"])
                .arg(&go)
                .arg("--hold-file")
                .arg(&hold)
                .envs(cann_env())
                .stdout(Stdio::null())
                .spawn()
                .expect("start python"),
        );
        let text = wait_for_text(&log, "READY", 300);
        let pid: u32 = log_lines(&text, "READY")[0]["pid"].parse().unwrap();
        // Picked up at its lazy init (device, streams), before its steps (generous: a loaded
        // machine delays the agent).
        let deadline = Instant::now() + Duration::from_secs(180);
        while !agent
            .metrics()
            .iter()
            .any(|(n, l, _)| n == "memscope_process_exited" && l["pid"] == pid.to_string())
        {
            assert!(
                Instant::now() < deadline,
                "{release}: the agent never picked up {pid}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        std::fs::write(&go, b"").unwrap();
        let text = wait_for_text(&log, "DONE", 300);
        let end = &log_lines(&text, "EMPTY_CACHE")[0];
        let allocated: u64 = end["allocated"].parse().unwrap();
        let reserved: u64 = end["reserved"].parse().unwrap();
        assert!(allocated > 0 && reserved > allocated, "{text}");
        let by_owner = |live: &BTreeMap<(String, String), u64>| -> (u64, u64, Vec<String>) {
            let mut pta = 0;
            let mut cann = 0;
            let mut others = Vec::new();
            for ((device, owner), bytes) in live {
                match owner.as_str() {
                    "PTA" if device == "0" => pta += bytes,
                    o if o.starts_with("CANN@") && device == "0" => cann += bytes,
                    o => others.push(format!("{device}/{o}: {bytes}")),
                }
            }
            (pta, cann, others)
        };
        // The agent is behind by its reorder window and snapshot interval, more under load.
        let deadline = Instant::now() + Duration::from_secs(90);
        let live = loop {
            let live = live_metrics(&agent.metrics(), pid);
            let (pta, cann, _) = by_owner(&live);
            if (pta, cann) == (allocated, reserved) || Instant::now() > deadline {
                break live;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let (pta, cann, others) = by_owner(&live);
        assert_eq!(
            (pta, cann, others),
            (allocated, reserved, vec![]),
            "{release}: (PTA, CANN, other) live bytes of pid {pid} vs the script's \
             memory_allocated()/memory_reserved()\n{text}"
        );

        // Python frames: every tensor the script made went through its `alloc` function,
        // called from `main`; the PTA blocks alone make at least the bytes it logged (the
        // segments the caching allocator grew by inside it come on top).
        let (status, body) =
            get(&agent.addr, &format!("/debug/pprof/heap?pid={pid}")).expect("GET heap?pid");
        assert_eq!(status, 200);
        let profile = dir.join("torch.pb.gz");
        std::fs::write(&profile, &body).unwrap();
        let top = pprof_top(&profile, &["-cum", "-sample_index=alloc_space"]);
        let cum = |name: &str| -> u64 {
            top.iter()
                .find(|(_, _, n)| n == name)
                .map(|r| r.1)
                .unwrap_or_else(|| panic!("{release}: no {name} in pprof -top:\n{top:?}"))
        };
        let made: u64 = log_lines(&text, "ALLOC")
            .iter()
            .map(|a| a["bytes"].parse::<u64>().unwrap())
            .sum();
        assert!(made > 0);
        // Every block's stack reaches the interpreter (the copy goes past its outermost
        // loop), however deep the release's allocator path.
        assert!(
            cum("alloc") >= made,
            "{release}: alloc() made {made} bytes, pprof says {}:\n{top:?}",
            cum("alloc")
        );
        // (`<lambda>` and `<module>` are there too, but pprof's name simplification, made
        // for C++ templates, shows them as `<unknown>`.)
        assert!(cum("main") >= cum("alloc"), "{top:?}");
        std::fs::write(&hold, b"").unwrap();
        let status = job.0.wait().unwrap();
        assert!(status.success(), "{release}: the script failed\n{text}");
    }
    agent.stop();
}

/// The agent on PyPI's CUDA torch (the CUDA test bed, xtask/src/cuda_bed.rs): a job started
/// after the agent is picked up at its first CUDA tensor (`--lib` puts the probes in the bed's
/// `libcudart.so.12` and `libc10.so` at start), and while it holds its tensors after
/// `empty_cache()`,
/// /metrics says what the job itself printed: PTA live bytes = `memory_allocated()` (c10's
/// reports), CUDA live bytes = `memory_reserved()` (the runtime's `cudaMalloc` segments).
#[test]
fn agent_reports_a_cuda_torch_job_by_owner() {
    const TEST: &str = "agent_reports_a_cuda_torch_job_by_owner";
    if !require_root(TEST) {
        return;
    }
    let Some(venv) = std::env::var_os("MEMSCOPE_CUDA_VENV").map(PathBuf::from) else {
        println!("SKIPPED {TEST}: MEMSCOPE_CUDA_VENV is not set (cargo xtask test sets it)");
        return;
    };
    let _g = serial();
    let site = venv.join("lib/python3.11/site-packages");
    let cudart = site.join("nvidia/cuda_runtime/lib/libcudart.so.12");
    let c10 = site.join("torch/lib/libc10.so");
    let agent = Agent::start_without_libs(&[
        "--lib",
        cudart.to_str().unwrap(),
        "--lib",
        c10.to_str().unwrap(),
        "--sample-bytes",
        "0",
    ]);
    let dir = scratch("agent-cuda");
    let (log, go, hold) = (dir.join("gt.log"), dir.join("go"), dir.join("hold"));
    let _release_hold = GoOnDrop(hold.clone());
    let _release_go = GoOnDrop(go.clone());
    let _job = KillOnDrop(
        Command::new(venv.join("bin/python"))
            .arg(repo_root().join("tests/fixtures/python/torch_cuda_train.py"))
            .arg("--log")
            .arg(&log)
            .arg("--wait-file")
            .arg(&go)
            .arg("--hold-file")
            .arg(&hold)
            .arg("--warmup")
            .stdout(Stdio::null())
            .spawn()
            .expect("start python"),
    );
    let text = wait_for_text(&log, "READY", 300);
    let pid: u32 = log_lines(&text, "READY")[0]["pid"].parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    while !agent
        .metrics()
        .iter()
        .any(|(n, l, _)| n == "memscope_process_exited" && l["pid"] == pid.to_string())
    {
        assert!(Instant::now() < deadline, "the agent never picked up {pid}");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::write(&go, b"").unwrap();
    let text = wait_for_text(&log, "DONE", 300);
    let end = &log_lines(&text, "EMPTY_CACHE")[0];
    let allocated: u64 = end["allocated"].parse().unwrap();
    let reserved: u64 = end["reserved"].parse().unwrap();
    assert!(allocated > 0 && reserved > allocated, "{text}");
    let want: BTreeMap<(String, String), u64> = [
        (("0".to_string(), "PTA".to_string()), allocated),
        (("0".to_string(), "CUDA".to_string()), reserved),
    ]
    .into();
    // The agent is behind by its reorder window and snapshot interval, more under load.
    let deadline = Instant::now() + Duration::from_secs(90);
    let live = loop {
        let live = live_metrics(&agent.metrics(), pid);
        if live == want || Instant::now() > deadline {
            break live;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        live, want,
        "(device, owner) live bytes of pid {pid} vs the script's memory_allocated()/\
         memory_reserved()\n{text}"
    );
    // The heap profile: with --sample-bytes 0 every CUDA allocation carries its stack, so no
    // in-use byte sits on the process's root frame alone.
    let (status, body) =
        get(&agent.addr, &format!("/debug/pprof/heap?pid={pid}")).expect("GET heap");
    assert_eq!(status, 200);
    let profile = dir.join("cuda.pb.gz");
    std::fs::write(&profile, &body).unwrap();
    let top = pprof_top(&profile, &["-cum", "-sample_index=inuse_space"]);
    let root = top
        .iter()
        .find(|(_, _, name)| name.ends_with(&format!("(pid {pid})")))
        .unwrap_or_else(|| panic!("no root frame for pid {pid} in pprof -top:\n{top:?}"));
    assert_eq!(
        root.1,
        allocated + reserved,
        "in-use bytes of the process\n{top:?}"
    );
    assert_eq!(root.0, 0, "in-use bytes without a stack\n{top:?}");
}

/// The released mindspore wheel with virtual memory management on (its default), picked up by
/// the agent: its pool's live blocks are MINDSPORE bytes equal to its own memory_allocated(),
/// and the physical memory mapped behind them (driver handles, `halMemCreate`) is CANN bytes
/// equal to its memory_reserved(), nothing else: VMM memory is accounted as `halMemAlloc`
/// memory is.
#[test]
fn agent_accounts_a_real_mindspore_jobs_vmm_memory() {
    const TEST: &str = "agent_accounts_a_real_mindspore_jobs_vmm_memory";
    if !require_root(TEST) {
        return;
    }
    let Some(venv) = std::env::var_os("MEMSCOPE_MINDSPORE_VENV").map(PathBuf::from) else {
        eprintln!("SKIPPED {TEST}: MEMSCOPE_MINDSPORE_VENV is not set");
        println!("SKIPPED {TEST}: no mindspore test bed");
        return;
    };
    let _g = serial();
    let lib64 = cann_dir().join("lib64");
    let libs: Vec<String> = ["libascend_hal.so", "libascendcl.so"]
        .iter()
        .map(|l| lib64.join(l).display().to_string())
        .collect();
    let agent =
        Agent::start_without_libs(&["--lib", &libs[0], "--lib", &libs[1], "--sample-bytes", "0"]);
    let dir = scratch("agent-mindspore");
    let (log, go, hold) = (dir.join("gt.log"), dir.join("go"), dir.join("hold"));
    let _release_hold = GoOnDrop(hold.clone());
    let _release_go = GoOnDrop(go.clone());
    let mut job = KillOnDrop(
        Command::new(venv.join("bin/python"))
            .arg(repo_root().join("tests/fixtures/python/mindspore_train.py"))
            .arg("--log")
            .arg(&log)
            .args(["--steps", "5", "--wait-file"])
            .arg(&go)
            .arg("--hold-file")
            .arg(&hold)
            .envs(cann_env())
            .stdout(Stdio::null())
            .spawn()
            .expect("start python"),
    );
    let text = wait_for_text(&log, "READY", 300);
    let pid: u32 = log_lines(&text, "READY")[0]["pid"].parse().unwrap();
    assert_eq!(log_lines(&text, "READY")[0]["device"], "Ascend", "{text}");
    let deadline = Instant::now() + Duration::from_secs(180);
    while !agent
        .metrics()
        .iter()
        .any(|(n, l, _)| n == "memscope_process_exited" && l["pid"] == pid.to_string())
    {
        assert!(Instant::now() < deadline, "the agent never picked up {pid}");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::write(&go, b"").unwrap();
    let text = wait_for_text(&log, "DONE", 300);
    let end = &log_lines(&text, "END")[0];
    let allocated: u64 = end["allocated"].parse().unwrap();
    let reserved: u64 = end["reserved"].parse().unwrap();
    assert!(allocated > 0 && reserved > allocated, "{text}");
    let by_owner = |live: &BTreeMap<(String, String), u64>| -> (u64, u64, Vec<String>) {
        let (mut ms, mut cann, mut others) = (0, 0, Vec::new());
        for ((device, owner), bytes) in live {
            match owner.as_str() {
                "MINDSPORE" if device == "0" => ms += bytes,
                o if o.starts_with("CANN@") && device == "0" => cann += bytes,
                o => others.push(format!("{device}/{o}: {bytes}")),
            }
        }
        (ms, cann, others)
    };
    // The agent is behind by its reorder window and snapshot interval, more under load.
    let deadline = Instant::now() + Duration::from_secs(90);
    let live = loop {
        let live = live_metrics(&agent.metrics(), pid);
        if by_owner(&live).0 == allocated && by_owner(&live).1 == reserved
            || Instant::now() > deadline
        {
            break live;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        by_owner(&live),
        (allocated, reserved, vec![]),
        "(MINDSPORE, CANN, other) live bytes of pid {pid} vs the script's \
         memory_allocated()/memory_reserved()\n{text}"
    );
    std::fs::write(&hold, b"").unwrap();
    let status = job.0.wait().unwrap();
    assert!(status.success(), "the script failed\n{text}");
    agent.stop();
}
