//! The node agent on a fleet's node (issue 28): processes in containers are labelled with
//! their container and pod from their cgroup (real cgroups made here, named as containerd,
//! CRI-O and systemd name them), and `/metrics` passes independent checkers in both formats
//! it speaks: `promtool check metrics` (Debian `prometheus`) for the 0.0.4 text format, the
//! OpenMetrics parser of PyPI's `prometheus_client` for OpenMetrics. Bytes are checked
//! against each program's own log.

mod common;

use std::{
    collections::BTreeMap,
    io::{BufRead, Read, Write},
    net::TcpStream,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::{
    agent::{TestAgent, samples},
    *,
};

/// What Prometheus 2.x sends when it scrapes (its `scrapeAcceptHeader`).
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,\
    application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// One GET with an optional `Accept`: (status, Content-Type, body).
fn get_with(addr: &str, path: &str, accept: Option<&str>) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the agent");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let all = String::from_utf8_lossy(&all).into_owned();
    let (head, body) = all.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let content_type = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Type: "))
        .unwrap_or("")
        .to_string();
    (status, content_type, body.to_string())
}

/// Device -> bytes still live at the end of a workload log (MALLOC not FREEd, by address).
fn live_by_device(log: &Path) -> BTreeMap<String, u64> {
    let gt = parse_log(log);
    let mut live: BTreeMap<u64, (String, u64)> = BTreeMap::new();
    for b in &gt.blocks {
        match b.kind.as_str() {
            "MALLOC" => {
                live.insert(b.addr, (b.dev.clone(), b.size));
            }
            "FREE" => {
                live.remove(&b.addr);
            }
            _ => {}
        }
    }
    let mut by = BTreeMap::new();
    for (dev, size) in live.into_values() {
        *by.entry(dev).or_default() += size;
    }
    by
}

/// The cgroup v2 hierarchy's mount point (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a
/// hybrid host).
fn cgroup2_root() -> PathBuf {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mount = left.split(' ').nth(4)?;
            (right.split(' ').next()? == "cgroup2").then(|| PathBuf::from(mount))
        })
        .expect("no cgroup2 hierarchy is mounted (mount -t cgroup2 none /sys/fs/cgroup)")
}

/// Cgroups made for one test, removed (innermost first) however it ends; their processes
/// have exited by then.
struct Cgroups(Vec<PathBuf>);

impl Cgroups {
    /// Makes `root/rel` and every folder on the way; returns its path.
    fn make(&mut self, root: &Path, rel: &str) -> PathBuf {
        let mut dir = root.to_path_buf();
        for part in rel.split('/') {
            dir.push(part);
            if !dir.exists() {
                std::fs::create_dir(&dir)
                    .unwrap_or_else(|e| panic!("mkdir cgroup {}: {e}", dir.display()));
                self.0.push(dir.clone());
            }
        }
        dir
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for dir in self.0.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// Starts fixture `workload` inside `cgroup` (it joins before exec, so every allocation is
/// made there), holding before its steps until the agent shows it; returns its pid once it
/// has exited.
fn run_in_cgroup(agent: &TestAgent, cgroup: &Path, log: &Path) -> u32 {
    let go = log.with_extension("go");
    let procs = cgroup.join("cgroup.procs");
    let mut cmd = Command::new(bin("workload"));
    // Five steps: the leak of step 1 is a suspect from step 4 on (--leak-steps 3).
    cmd.args([
        "--devices",
        "2",
        "--steps",
        "5",
        "--allocs",
        "2",
        "--leaks",
        "1",
    ])
    .args(["--pre-allocs", "1", "--wait-file"])
    .arg(&go)
    .arg("--log")
    .arg(log)
    .stdout(Stdio::piped());
    let procs = std::ffi::CString::new(procs.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: between fork and exec only open/write/close (async-signal-safe) on a path
    // made before the fork; writing "0" moves the writing process itself.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let wrote = libc::write(fd, b"0".as_ptr().cast(), 1);
            let err = std::io::Error::last_os_error();
            libc::close(fd);
            if wrote == 1 { Ok(()) } else { Err(err) }
        });
    }
    let mut child = cmd.spawn().expect("start workload in its cgroup");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pid: u32 = line.trim().strip_prefix("PID ").unwrap().parse().unwrap();
    let needle = format!("memscope_live_bytes{{pid=\"{pid}\"");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !get_with(&agent.addr, "/metrics", None)
        .2
        .lines()
        .any(|l| l.starts_with(&needle))
    {
        if Instant::now() > deadline {
            let _ = std::fs::write(&go, b"");
            let _ = child.wait();
            panic!("the agent never picked up {pid}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::fs::write(&go, b"").unwrap();
    assert!(child.wait().unwrap().success(), "workload failed");
    agent.wait_reported_exit(pid);
    pid
}

/// A 64-hex-digit container id and a pod UID unique to this run (the test's pid and time).
fn ids(n: u64) -> (String, String) {
    let seed = ((std::process::id() as u64) << 20)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
    // The short id (12 digits) differs between n's too.
    let id = format!("{n:04x}{:012x}", seed & 0xffff_ffff_ffff).repeat(4);
    let uid = format!(
        "{:08x}-{:04x}-4{:03x}-8000-{:012x}",
        std::process::id(),
        n,
        n,
        seed & 0xffff_ffff_ffff
    );
    (id, uid)
}

/// `go tool pprof -traces` of a profile, keeping only samples with `tag=value`. The value is
/// anchored as a regexp: pprof reads a bare value of digits, or digits then letters (a
/// container id such as `00010702605e`, ~6% of this test's random ids), as a number with a
/// unit, which matched no sample (seen once in CI).
fn pprof_traces(profile: &Path, tag: &str, value: &str) -> String {
    let out = Command::new("go")
        .args(["tool", "pprof", "-traces", "-sample_index=inuse_space"])
        .arg(format!("-tagfocus={tag}=^{value}$"))
        .arg(profile)
        .output()
        .expect("run `go tool pprof` (Debian golang-go; `cargo xtask setup` installs it)");
    assert!(
        out.status.success(),
        "go tool pprof failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Two "containers" (cgroups named as containerd and CRI-O name them under the kubelet's
/// systemd driver, each in its own pod): every per-process series of each program carries its
/// container's short id and its pod's UID, its live bytes per device equal its own log, and
/// its heap-profile samples carry the same labels (`go tool pprof -tagfocus`).
#[test]
fn each_containers_series_and_samples_carry_its_container_and_pod() {
    if !require_root("each_containers_series_and_samples_carry_its_container_and_pod") {
        return;
    }
    let _g = serial();
    let dir = scratch("agent-fleet-containers");
    let root = cgroup2_root();
    let mut cgroups = Cgroups(Vec::new());
    let top = format!("memscope-fleet-labels-{}", std::process::id());
    let (id_a, uid_a) = ids(1);
    let (id_b, uid_b) = ids(2);
    let a = cgroups.make(
        &root,
        &format!(
            "{top}/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{id_a}.scope",
            uid_a.replace('-', "_")
        ),
    );
    let b = cgroups.make(
        &root,
        &format!(
            "{top}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/crio-{id_b}.scope",
            uid_b.replace('-', "_")
        ),
    );

    // Every stack kept: the profile holds every live block of both.
    let agent = TestAgent::start(&["--sample-bytes", "0"]);
    let log_a = dir.join("a.log");
    let log_b = dir.join("b.log");
    let pid_a = run_in_cgroup(&agent, &a, &log_a);
    let pid_b = run_in_cgroup(&agent, &b, &log_b);
    let (status, _, body) = get_with(&agent.addr, "/metrics", None);
    assert_eq!(status, 200);
    let m = samples(&body);

    for (pid, id, uid, log) in [
        (pid_a, &id_a, &uid_a, &log_a),
        (pid_b, &id_b, &uid_b, &log_b),
    ] {
        let mine: Vec<_> = m
            .iter()
            .filter(|(_, l, _)| l.get("pid") == Some(&pid.to_string()))
            .collect();
        assert!(mine.len() > 5, "few series for pid {pid}: {mine:?}");
        for (name, labels, _) in &mine {
            assert_eq!(
                labels.get("container").map(String::as_str),
                Some(&id[..12]),
                "{name}{labels:?} of pid {pid}"
            );
            assert_eq!(
                labels.get("pod_uid"),
                Some(uid),
                "{name}{labels:?} of pid {pid}"
            );
        }
        let mut live: BTreeMap<String, u64> = BTreeMap::new();
        for (_, l, v) in mine.iter().filter(|(n, _, _)| n == "memscope_live_bytes") {
            *live.entry(l["device"].clone()).or_default() += *v as u64;
        }
        live.retain(|_, v| *v > 0);
        let want = live_by_device(log);
        assert!(!want.is_empty(), "the workload leaks, so bytes stay live");
        assert_eq!(
            live,
            want,
            "live bytes per device of pid {pid} vs {}",
            log.display()
        );
    }

    let (status, _, _) = get_with(&agent.addr, "/", None);
    assert_eq!(status, 200);
    let mut s = TcpStream::connect(&agent.addr).unwrap();
    write!(
        s,
        "GET /debug/pprof/heap HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        agent.addr
    )
    .unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let split = all.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let profile = dir.join("heap.pb.gz");
    std::fs::write(&profile, &all[split + 4..]).unwrap();
    for (pid, other, id, uid) in [(pid_a, pid_b, &id_a, &uid_a), (pid_b, pid_a, &id_b, &uid_b)] {
        for (tag, value) in [("container", &id[..12]), ("pod_uid", uid.as_str())] {
            let traces = pprof_traces(&profile, tag, value);
            assert!(
                traces.contains(&format!("(pid {pid})")),
                "{tag}={value}: no sample of pid {pid}:\n{traces}"
            );
            assert!(
                !traces.contains(&format!("(pid {other})")),
                "{tag}={value}: a sample of the other container's pid {other}:\n{traces}"
            );
        }
    }
    let (code, stderr) = agent.stop();
    assert_eq!(code, Some(0), "agent exit; stderr:\n{stderr}");
    drop(cgroups);
}

/// The agent's exposition in both formats, checked by tools that are not ours: with no
/// `Accept` (curl, promtool) the 0.0.4 text format, which `promtool check metrics` passes
/// with no warning; with Prometheus's `Accept` OpenMetrics 1.0.0 (`# UNIT`, `# EOF`), which
/// `prometheus_client`'s OpenMetrics parser reads whole, its counters equal to the log's.
#[test]
fn metrics_pass_promtool_and_the_openmetrics_parser() {
    if !require_root("metrics_pass_promtool_and_the_openmetrics_parser") {
        return;
    }
    let _g = serial();
    let dir = scratch("agent-fleet-formats");
    let root = cgroup2_root();
    let mut cgroups = Cgroups(Vec::new());
    // A plain systemd service: `container` is the unit's name, dots and all.
    let unit = format!("train-job-{}.service", std::process::id());
    let cg = cgroups.make(
        &root,
        &format!(
            "memscope-fleet-labels-{}/system.slice/{unit}",
            std::process::id()
        ),
    );
    // And a pod's container under the kubelet's cgroupfs driver: `pod_uid` is there too.
    let (id, uid) = ids(3);
    let pod_cg = cgroups.make(
        &root,
        &format!(
            "memscope-fleet-labels-{}/kubepods/burstable/pod{uid}/{id}",
            std::process::id()
        ),
    );
    let agent = TestAgent::start(&[]);
    let log = dir.join("job.log");
    let pid = run_in_cgroup(&agent, &cg, &log);
    run_in_cgroup(&agent, &pod_cg, &dir.join("pod.log"));

    let (status, content_type, text) = get_with(&agent.addr, "/metrics", None);
    assert_eq!(status, 200);
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    assert!(
        !text.contains("# EOF") && !text.contains("# UNIT"),
        "{text}"
    );
    assert!(
        text.contains(&format!("container=\"{unit}\"")),
        "no container label:\n{text}"
    );
    std::fs::write(dir.join("metrics.txt"), &text).unwrap();
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool (Debian package prometheus; `cargo xtask setup` installs it)");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics ({}): {said}",
        out.status
    );

    let (status, content_type, om) = get_with(&agent.addr, "/metrics", Some(PROMETHEUS_ACCEPT));
    assert_eq!(status, 200);
    assert_eq!(
        content_type,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(om.ends_with("# EOF\n"), "OpenMetrics ends with # EOF");
    let om_file = dir.join("metrics.om");
    std::fs::write(&om_file, &om).unwrap();
    // The parser raises on anything OpenMetrics does not allow; it prints what it read:
    // family, type, unit, and each sample with its labels.
    let script = r#"
import sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
for f in text_string_to_metric_families(open(sys.argv[1]).read()):
    for s in f.samples:
        labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        print(f.name, f.type, f.unit or "-", s.name, labels, s.value)
"#;
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(&om_file)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "prometheus_client's OpenMetrics parser refused the exposition (PyPI \
         prometheus-client; `cargo xtask setup` installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed = String::from_utf8_lossy(&out.stdout).into_owned();
    let row = |family: &str| -> Vec<Vec<String>> {
        parsed
            .lines()
            .map(|l| l.split(' ').map(str::to_string).collect::<Vec<_>>())
            .filter(|f| f[0] == family && f[4].split(',').any(|kv| kv == format!("pid={pid}")))
            .collect()
    };
    let gt = parse_log(&log);
    let allocations = row("memscope_allocations");
    assert_eq!(allocations.len(), 1, "{parsed}");
    assert_eq!(allocations[0][1], "counter");
    assert_eq!(allocations[0][3], "memscope_allocations_total");
    assert_eq!(
        allocations[0][5].parse::<f64>().unwrap() as u64,
        gt.summary["mallocs"]
    );
    assert!(allocations[0][4].contains(&format!("container={unit}")));
    let live = row("memscope_live_bytes");
    assert!(!live.is_empty(), "{parsed}");
    assert!(live.iter().all(|f| f[1] == "gauge" && f[2] == "bytes"));
    let live_total: f64 = live.iter().map(|f| f[5].parse::<f64>().unwrap()).sum();
    assert_eq!(
        live_total as u64,
        live_by_device(&log).values().sum::<u64>()
    );
    // Every metric the dashboard (deploy/kubernetes) queries is one this agent exports, and
    // every label it groups by is the agent's or the scrape job's `node`.
    let exported = samples(&text);
    for (title, q) in dashboard::dashboard_queries() {
        for name in dashboard::metric_names(&q) {
            assert!(
                exported.iter().any(|(n, _, _)| *n == name),
                "panel {title:?} reads {name}, which the agent does not export"
            );
        }
        for label in dashboard::grouping_labels(&q) {
            assert!(
                label == "node" || exported.iter().any(|(_, l, _)| l.contains_key(&label)),
                "panel {title:?} groups by {label}, which no series has"
            );
        }
    }
    let cpu: Vec<_> = parsed
        .lines()
        .filter(|l| l.starts_with("memscope_agent_cpu_seconds counter seconds "))
        .collect();
    assert_eq!(cpu.len(), 1, "{parsed}");

    let (code, stderr) = agent.stop();
    assert_eq!(code, Some(0), "agent exit; stderr:\n{stderr}");
    drop(cgroups);
}
