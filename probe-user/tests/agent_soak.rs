//! The node agent runs for months: thousands of short traced jobs must leave its descriptors,
//! threads and memory where they were (issue 27). The size here fits CI; `cargo xtask bench --only
//! agent-soak` runs the same test with `MEMSCOPE_SOAK_JOBS` in the thousands and records the
//! figures in docs/benchmarks-agent-soak.md.

mod common;

use std::{
    process::{Command, Stdio},
    time::Instant,
};

use common::{agent::TestAgent, *};

/// Short jobs run through the agent (CI size; the bench sets thousands). On the old agent 300
/// of them left 300 descriptors of `workload` (1,800 in all) and ~270 MiB more resident memory.
const DEFAULT_JOBS: usize = 300;

/// Descriptors, threads and resident memory of a process.
#[derive(Clone, Copy, Debug)]
struct Usage {
    fds: usize,
    threads: usize,
    rss_kib: u64,
}

/// What each descriptor of a process refers to (for the message when they grew).
fn fd_targets(pid: u32) -> std::collections::BTreeMap<String, usize> {
    let mut m = std::collections::BTreeMap::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        let t = std::fs::read_link(e.path())
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        *m.entry(t).or_default() += 1;
    }
    m
}

fn usage(pid: u32) -> Usage {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the agent's fd table")
        .count();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    };
    Usage {
        fds,
        threads: field("Threads:") as usize,
        rss_kib: field("VmRSS:"),
    }
}

/// One short traced job: HAL allocations and frees for 20 ms, then exit (long enough for the
/// agent to see it alive and read its maps for its sampled stacks). Returns its pid.
fn short_job() -> u32 {
    let out = Command::new(bin("workload"))
        .args(["--loop-ms", "20"])
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "workload failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("PID "))
        .and_then(|p| p.trim().parse().ok())
        .expect("PID line")
}

fn run_jobs(agent: &TestAgent, n: usize) {
    let mut last = 0;
    for _ in 0..n {
        last = short_job();
    }
    agent.wait_reported_exit(last);
}

#[test]
fn thousands_of_short_jobs_leave_the_agents_fds_threads_and_memory_bounded() {
    if !require_root("thousands_of_short_jobs_leave_the_agents_fds_threads_and_memory_bounded") {
        return;
    }
    let _serial = serial();
    let jobs: usize = std::env::var("MEMSCOPE_SOAK_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_JOBS);
    // Stacks on (the default); few exited processes kept, so the numbers must come back.
    let agent = TestAgent::start(&["--max-exited", "16"]);
    let pid = agent.pid();
    // Warm up: the symbolizer parses the few distinct objects once and keeps them.
    run_jobs(&agent, 20);
    let before = usage(pid);
    let targets_before = fd_targets(pid);
    let started = Instant::now();
    run_jobs(&agent, jobs);
    let secs = started.elapsed().as_secs_f64();
    // The agent traces every process of the node: on a shared machine others' jobs come and
    // go meanwhile, with descriptors and memory of their own. The descriptors of our jobs'
    // own executable are ours alone: each job used to leave one (and ~3 more on its
    // libraries) for good.
    let workload = std::fs::canonicalize(bin("workload")).unwrap();
    let ours = |pid: u32| {
        fd_targets(pid)
            .get(&workload.display().to_string())
            .copied()
            .unwrap_or(0)
    };
    // The symbolizer keeps the one copy it parsed. The last jobs' stacks may still be
    // resolving (their files are held until then): give the agent a moment to settle.
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    while ours(pid) > 2 && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let after = usage(pid);
    let held = ours(pid);
    let grown: Vec<(String, usize)> = fd_targets(pid)
        .into_iter()
        .filter_map(|(t, n)| {
            let was = targets_before.get(&t).copied().unwrap_or(0);
            (n > was).then(|| (t, n - was))
        })
        .collect();
    println!(
        "SOAK jobs={jobs} secs={secs:.1} fds={}->{} threads={}->{} rss_kib={}->{} \
         job_fds_held={held}",
        before.fds, after.fds, before.threads, after.threads, before.rss_kib, after.rss_kib
    );
    assert!(
        held <= 2,
        "{held} descriptors of exited jobs' files still held: {before:?} -> {after:?}; \
         new: {grown:?}"
    );
    // A leak shows as copies of the same files (libc, ld.so) piling up, one per job. The
    // symbolizer keeps one open copy of each distinct object it parsed, and a process alive
    // now pins its own: on a shared machine, others' jobs add a few of those (and probe
    // links, `anon_inode:bpf_link`, for the libraries they bring).
    let piled: Vec<&(String, usize)> = grown
        .iter()
        .filter(|(t, n)| t.starts_with('/') && *n > 16)
        .collect();
    assert!(
        piled.is_empty(),
        "descriptors of the same files piled up: {piled:?}; {before:?} -> {after:?}"
    );
    // The HTTP thread's blocking pool may hold a few idle threads for a while.
    assert!(
        after.threads <= before.threads + 8,
        "threads grew with the jobs: {before:?} -> {after:?}"
    );
    // ~1 MiB per job before the fix. Loose: others' jobs on a shared machine (a torch run's
    // libraries parsed once for their stacks) took over 500 MiB while 5,000 jobs ran.
    assert!(
        after.rss_kib <= before.rss_kib + 1024 * 1024,
        "resident memory grew with the jobs: {before:?} -> {after:?}"
    );
    let (code, stderr) = agent.stop();
    assert_eq!(code, Some(0), "agent exit status; stderr:\n{stderr}");
}
