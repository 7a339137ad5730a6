//! The node agent's hold (docs/agent.md, "No first allocation missed"), end to end with the
//! real agent binary started with its defaults (no `--lib`): jobs in "containers" (new mount
//! and PID namespaces, each in its own cgroup, each with its own copy of the simulated vendor
//! libraries) have every allocation counted; a process that opens no vendor library is never
//! stopped; a hold outlives no frozen agent; a job over in a fraction of a second keeps its
//! name, steps and symbolized frames. Ground truth: each program's own log, its own count of
//! SIGCONTs received, and /proc.

mod common;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::{agent::*, *};

fn metrics(agent: &TestAgent) -> Samples {
    let (status, body) = get(&agent.addr, "/metrics").expect("GET /metrics");
    assert_eq!(status, 200);
    samples(&body)
}

/// A label-free series' value (0 when absent).
fn global(m: &Samples, name: &str) -> f64 {
    m.iter()
        .find(|(n, l, _)| n == name && l.is_empty())
        .map_or(0.0, |(_, _, v)| *v)
}

/// Device -> bytes live at the end of a fixture log (driver blocks), and its allocations.
fn log_live_by_device(log: &Path) -> (BTreeMap<String, u64>, u64) {
    let text = std::fs::read_to_string(log).unwrap();
    let mut live: BTreeMap<u64, (String, u64)> = BTreeMap::new();
    let mut allocs = 0;
    for line in text.lines() {
        let f = log_fields(line);
        match line.split(' ').next() {
            Some("MALLOC") => {
                allocs += 1;
                live.insert(
                    hex(f["addr"]),
                    (f["dev"].to_string(), f["size"].parse().unwrap()),
                );
            }
            Some("FREE") => {
                live.remove(&hex(f["addr"]));
            }
            _ => {}
        }
    }
    let mut by = BTreeMap::new();
    for (dev, size) in live.into_values() {
        *by.entry(dev).or_default() += size;
    }
    (by, allocs)
}

/// Device -> live bytes the agent reports for `pid` (every owner; zero series left out).
/// The (`container`, `pod_uid`) labels on the series of `pid` ("" where left out): one pair
/// when every series carries the same.
fn containers_of_pid(m: &Samples, pid: u32) -> std::collections::BTreeSet<(String, String)> {
    m.iter()
        .filter(|(_, l, _)| l.get("pid") == Some(&pid.to_string()))
        .map(|(_, l, _)| {
            let get = |k: &str| l.get(k).cloned().unwrap_or_default();
            (get("container"), get("pod_uid"))
        })
        .collect()
}

fn metrics_live_by_device(m: &Samples, pid: u32) -> BTreeMap<String, u64> {
    let mut by = BTreeMap::new();
    for (_, l, v) in m
        .iter()
        .filter(|(n, l, _)| n == "memscope_live_bytes" && l["pid"] == pid.to_string())
    {
        *by.entry(l["device"].clone()).or_default() += *v as u64;
    }
    by.retain(|_, v| *v > 0);
    by
}

/// Waits until /metrics says each of `pids` exited; on failure, says what the agent's log
/// says of them.
fn wait_exited(agent: &mut TestAgent, pids: &[u32], dir: &Path) -> Samples {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let m = metrics(agent);
        if pids
            .iter()
            .all(|pid| of_pid(&m, "memscope_process_exited", *pid) == Some(1.0))
        {
            return m;
        }
        if Instant::now() > deadline {
            let bg = agent.bg.take().unwrap();
            // SAFETY: plain kill(2) on our child.
            unsafe { libc::kill(bg.child.id() as i32, libc::SIGTERM) };
            let (_, text) = bg.finish();
            let about: Vec<&str> = text
                .lines()
                .filter(|l| {
                    pids.iter().any(|p| l.contains(&format!(" {p} ")))
                        || l.contains(dir.to_str().unwrap())
                })
                .collect();
            panic!(
                "the agent never reported the exit of {pids:?}; its log of them:\n{}",
                about.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An "image": `workload_dlopen` and its own copy of the simulated HAL (a new inode, never
/// seen by the agent) in `vendor/`, a directory on no search path: only the open of the file
/// tells the agent of it, and the program calls it right after (the case the hold is for).
fn image(dir: &Path) -> PathBuf {
    let build = fixtures();
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::create_dir_all(dir.join("vendor")).unwrap();
    std::fs::copy(
        build.join("bin/workload_dlopen"),
        dir.join("bin/workload_dlopen"),
    )
    .unwrap();
    std::fs::copy(
        build.join("lib/libascend_hal.so"),
        dir.join("vendor/libascend_hal.so"),
    )
    .unwrap();
    dir.to_path_buf()
}

/// Where the unified (v2) cgroup hierarchy is mounted.
fn cgroup2_root() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    mounts
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(f[1]))
        })
        .expect("a cgroup2 mount")
}

/// A cgroup made for the test, removed (with its parents up to the test's own) at the end.
struct Cgroup {
    path: PathBuf,
    top: PathBuf,
}

impl Cgroup {
    /// `rel` under a cgroup of this test run's own, named as a container runtime names it.
    fn new(rel: &str) -> Cgroup {
        let top = cgroup2_root().join(format!("memscope-test-{}", std::process::id()));
        let path = top.join(rel);
        std::fs::create_dir_all(&path).unwrap();
        Cgroup { path, top }
    }

    /// The cgroup path as /proc/PID/cgroup shows it ("0::/...").
    fn shown(&self) -> String {
        format!(
            "/{}",
            self.path.strip_prefix(cgroup2_root()).unwrap().display()
        )
    }

    /// Host pids in the cgroup running `comm`.
    fn pids_named(&self, comm: &str) -> Vec<u32> {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == comm)
            })
            .collect()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let mut dir = self.path.clone();
        while dir.starts_with(&self.top) {
            let _ = std::fs::remove_dir(&dir);
            if !dir.pop() {
                break;
            }
        }
    }
}

/// Starts `IMAGE/bin/workload ARGS` as a container would: in cgroup `cg`, in new mount and
/// PID namespaces, the image bind-mounted at `at` in its namespace only.
fn start_container(cg: &Cgroup, image: &Path, at: &Path, args: &[&str]) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let procs = std::ffi::CString::new(cg.path.join("cgroup.procs").to_str().unwrap()).unwrap();
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--mount",
        "--pid",
        "--fork",
        "--propagation",
        "private",
        "--",
    ])
    .args([
        "sh",
        "-c",
        r#"mount --bind "$1" "$2" && shift 2 && exec "$@""#,
        "sh",
    ])
    .arg(image)
    .arg(at)
    .arg(at.join("bin/workload_dlopen"))
    .args(args)
    .stdout(Stdio::null());
    // SAFETY: only open/write/close between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
            libc::close(fd);
            if ok {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        })
    };
    cmd.spawn().expect("start unshare")
}

/// The host pid of the one `workload_dlopen` in `cg`, once it has started.
fn workload_pid(cg: &Cgroup) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let [pid] = cg.pids_named("workload_dlopen")[..] {
            return pid;
        }
        assert!(Instant::now() < deadline, "no workload in {}", cg.shown());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn agent_counts_every_allocation_of_jobs_in_containers_started_after_it() {
    const TEST: &str = "agent_counts_every_allocation_of_jobs_in_containers_started_after_it";
    if !require_root(TEST) {
        return;
    }
    let _g = serial();
    let dir = scratch("agent-containers");
    // Both images are mounted at the same path, each in its own namespace: the path the
    // agent cleared in one container names another file in the other.
    let at = dir.join("opt-ascend");
    std::fs::create_dir_all(&at).unwrap();
    let containers = [
        (
            Cgroup::new(
                "kubepods.slice/kubepods-besteffort.slice/\
                 kubepods-besteffort-pod0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0.slice/\
                 cri-containerd-1111111111111111111111111111111111111111111111111111111111111111.scope",
            ),
            image(&dir.join("image-a")),
            dir.join("a.log"),
            ("111111111111", "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"),
        ),
        (
            Cgroup::new("docker/2222222222222222222222222222222222222222222222222222222222222222"),
            image(&dir.join("image-b")),
            dir.join("b.log"),
            ("222222222222", ""),
        ),
    ];
    // Started once the images exist: its discovery would otherwise see the copies being
    // written and probe them ahead of their containers.
    let mut agent = TestAgent::start_with_defaults(&["--log-level", "debug"]);
    let mut jobs = Vec::new();
    for (cg, image, log, _) in &containers {
        let go = log.with_extension("go");
        let hal = at.join("vendor/libascend_hal.so");
        // After the gate (so the test knows its pid), it opens the HAL and allocates at once.
        let args = [
            "--wait-file",
            go.to_str().unwrap(),
            "--lib-path",
            hal.to_str().unwrap(),
            "--allocs",
            "12",
            "--log",
            log.to_str().unwrap(),
        ];
        let child = start_container(cg, image, &at, &args);
        let pid = workload_pid(cg);
        jobs.push((child, pid, go));
    }
    let mut pids = Vec::new();
    for (mut child, pid, go) in jobs {
        std::fs::write(&go, b"").unwrap();
        assert!(child.wait().unwrap().success(), "container of {pid} failed");
        pids.push(pid);
    }
    let m = wait_exited(&mut agent, &pids, &dir);
    for ((cg, _, log, (container, pod_uid)), pid) in containers.iter().zip(&pids) {
        // Labelled with its container and pod, read while it was held (it is gone now).
        assert_eq!(
            containers_of_pid(&m, *pid),
            [(container.to_string(), pod_uid.to_string())].into(),
            "labels of pid {pid} in {}",
            cg.shown()
        );
        let (live, allocs) = log_live_by_device(log);
        assert!(allocs == 12 && !live.is_empty(), "{}", log.display());
        assert_eq!(
            of_pid(&m, "memscope_allocations_total", *pid),
            Some(allocs as f64),
            "allocations of pid {pid} in {} vs {}",
            cg.shown(),
            log.display()
        );
        assert_eq!(
            metrics_live_by_device(&m, *pid),
            live,
            "live bytes by device of pid {pid} in {} vs {}",
            cg.shown(),
            log.display()
        );
    }
    // A third container maps image A under another path: the same files (device and inode),
    // so no new probes, and every allocation counted all the same.
    let other = dir.join("srv-cann");
    std::fs::create_dir_all(&other).unwrap();
    let log_c = dir.join("c.log");
    let go_c = dir.join("c.go");
    let cg_c =
        Cgroup::new("docker/3333333333333333333333333333333333333333333333333333333333333333");
    let mut child = start_container(
        &cg_c,
        &containers[0].1,
        &other,
        &[
            "--wait-file",
            go_c.to_str().unwrap(),
            "--lib-path",
            other.join("vendor/libascend_hal.so").to_str().unwrap(),
            "--log",
            log_c.to_str().unwrap(),
        ],
    );
    let pid_c = workload_pid(&cg_c);
    std::fs::write(&go_c, b"").unwrap();
    assert!(child.wait().unwrap().success());
    let m = wait_exited(&mut agent, &[pid_c], &dir);
    let (live, allocs) = log_live_by_device(&log_c);
    assert_eq!(
        of_pid(&m, "memscope_allocations_total", pid_c),
        Some(allocs as f64)
    );
    assert_eq!(metrics_live_by_device(&m, pid_c), live);
    assert_eq!(
        containers_of_pid(&m, pid_c),
        [("333333333333".to_string(), String::new())].into()
    );
    let (code, text) = agent.stop();
    assert_eq!(code, Some(0), "{text}");
    let probed_at = |root: &Path| {
        text.lines()
            .filter(|l| l.contains(&format!("probe halMemAlloc at {}/", root.display())))
            .count()
    };
    assert_eq!(probed_at(&at), 2, "each image's HAL probed once:\n{text}");
    assert_eq!(
        probed_at(&other),
        0,
        "image A's HAL probed again under {}",
        other.display()
    );
}

/// A Python program that counts the SIGCONTs it receives (only a process that was stopped
/// is continued by the agent or its watchdog), waits for the file `argv[1]`, dlopens each of
/// `argv[3:]`, and writes its count to `argv[2]`.
const COUNTS_CONTINUES: &str = r#"
import ctypes, os, signal, sys, time
continued = 0
def on_cont(signum, frame):
    global continued
    continued += 1
signal.signal(signal.SIGCONT, on_cont)
print("PID", os.getpid(), flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
for path in sys.argv[3:]:
    ctypes.CDLL(path)
    time.sleep(0.005)
time.sleep(0.05)
with open(sys.argv[2], "w") as f:
    f.write(str(continued))
"#;

/// Starts `COUNTS_CONTINUES` opening `libs` once `gate` exists; returns it and its pid.
fn start_counting(
    dir: &Path,
    gate: &Path,
    count: &Path,
    libs: &[PathBuf],
) -> (std::process::Child, u32) {
    use std::io::BufRead;
    let script = dir.join("counts_continues.py");
    std::fs::write(&script, COUNTS_CONTINUES).unwrap();
    let mut child = Command::new("python3")
        .arg(&script)
        .arg(gate)
        .arg(count)
        .args(libs)
        .stdout(Stdio::piped())
        .spawn()
        .expect("run python3");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pid = line.trim().strip_prefix("PID ").unwrap().parse().unwrap();
    (child, pid)
}

/// Fresh copies of a fixture library, each in its own directory (paths the agent never saw).
fn copies(dir: &Path, lib: &str, n: usize) -> Vec<PathBuf> {
    (0..n)
        .map(|i| {
            let d = dir.join(format!("{lib}-{i}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::copy(fixtures().join("lib").join(lib), d.join(lib)).unwrap();
            d.join(lib)
        })
        .collect()
}

fn read_count(path: &Path) -> u32 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn agent_never_holds_a_process_that_opens_no_vendor_library() {
    const TEST: &str = "agent_never_holds_a_process_that_opens_no_vendor_library";
    if !require_root(TEST) {
        return;
    }
    let _g = serial();
    let dir = scratch("agent-no-hold");
    let plugins = copies(&dir, "libplugin.so", 20);
    let hal = copies(&dir, "libascend_hal.so", 1);
    let agent = TestAgent::start_with_defaults(&["--log-level", "debug"]);

    // Twenty shared objects the agent never saw, none of them a vendor library.
    let (gate, count) = (dir.join("plain.go"), dir.join("plain.count"));
    let (mut plain, plain_pid) = start_counting(&dir, &gate, &count, &plugins);
    std::fs::write(&gate, b"").unwrap();
    let mut states = Vec::new();
    while plain.try_wait().unwrap().is_none() {
        states.extend(process_state(plain_pid));
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        states.len() > 10,
        "too few looks at {plain_pid}: {states:?}"
    );
    assert!(
        !states.contains(&'T'),
        "{plain_pid} was stopped: {states:?}"
    );
    assert_eq!(
        read_count(&count),
        0,
        "{plain_pid} was continued, so it was stopped"
    );

    // The same program opening a vendor library is held (the check above can fail).
    let (gate, count) = (dir.join("hal.go"), dir.join("hal.count"));
    let (mut vendor, vendor_pid) = start_counting(&dir, &gate, &count, &hal);
    std::fs::write(&gate, b"").unwrap();
    assert!(vendor.wait().unwrap().success());
    assert!(read_count(&count) >= 1, "{vendor_pid} was never held");

    let (code, text) = agent.stop();
    assert_eq!(code, Some(0));
    let held = |pid: u32| text.contains(&format!("pid {pid} held at a vendor library's open"));
    assert!(!held(plain_pid) && held(vendor_pid), "{text}");
}

#[test]
fn watchdog_releases_a_process_held_while_the_agent_is_frozen() {
    const TEST: &str = "watchdog_releases_a_process_held_while_the_agent_is_frozen";
    if !require_root(TEST) {
        return;
    }
    let _g = serial();
    let dir = scratch("agent-frozen-hold");
    let hal = copies(&dir, "libascend_hal.so", 1);
    let mut agent = TestAgent::start_with_defaults(&[]);
    let (gate, count) = (dir.join("go"), dir.join("count"));
    let (mut job, pid) = start_counting(&dir, &gate, &count, &hal);
    let agent_pid = agent.pid() as i32;
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(agent_pid, libc::SIGSTOP) };
    std::fs::write(&gate, b"").unwrap();
    // Held at the open (nobody drains the ring), then continued by the watchdog alone. The
    // deadlines only keep a broken run from hanging: the watchdog's bound is 1 s.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen_stopped = false;
    let status = loop {
        if let Some(status) = job.try_wait().unwrap() {
            break Some(status);
        }
        seen_stopped |= process_state(pid) == Some('T');
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let released_at = Instant::now();
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(agent_pid, libc::SIGCONT) };
    let status = status.unwrap_or_else(|| {
        let _ = job.kill();
        panic!("{pid} still not through after 60 s with the agent frozen")
    });
    assert!(status.success());
    assert!(seen_stopped, "{pid} was never held");
    assert!(read_count(&count) >= 1, "{pid} was never continued");
    // The agent, thawed, finds the hold ended by the watchdog and counts it.
    let deadline = released_at + Duration::from_secs(60);
    while global(
        &metrics(&agent),
        "memscope_agent_holds_released_by_watchdog_total",
    ) < 1.0
    {
        assert!(
            Instant::now() < deadline,
            "no hold counted as the watchdog's"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let bg = agent.bg.take().unwrap();
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(bg.child.id() as i32, libc::SIGTERM) };
    assert_eq!(bg.finish().0, Some(0));
}

/// One HTTP GET with a binary body: (status, body).
fn get_bytes(addr: &str, path: &str) -> (u16, Vec<u8>) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let split = all.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&all[..split]).into_owned();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, all[split + 4..].to_vec())
}

/// `go tool pprof -top` of a profile: the function names it lists.
fn pprof_functions(profile: &Path) -> Vec<String> {
    let out = Command::new("go")
        .args(["tool", "pprof", "-top", "-sample_index=inuse_space"])
        .arg(profile)
        .output()
        .expect("run `go tool pprof` (Debian golang-go; `cargo xtask setup` installs it)");
    assert!(
        out.status.success(),
        "go tool pprof: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 6 && f[1].ends_with('%')).then(|| f[5..].join(" "))
        })
        .collect()
}

#[test]
fn a_job_over_in_a_moment_keeps_its_name_steps_and_frames() {
    const TEST: &str = "a_job_over_in_a_moment_keeps_its_name_steps_and_frames";
    if !require_root(TEST) {
        return;
    }
    let _g = serial();
    let dir = scratch("agent-short-job");
    // The workload linked against its own copies of the HAL, ACL and mstx (never seen).
    let build = fixtures();
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::create_dir_all(dir.join("lib")).unwrap();
    std::fs::copy(build.join("bin/workload"), dir.join("bin/workload")).unwrap();
    for lib in ["libascend_hal.so", "libascendcl.so", "libms_tools_ext.so"] {
        std::fs::copy(build.join("lib").join(lib), dir.join("lib").join(lib)).unwrap();
    }
    let mut agent = TestAgent::start_with_defaults(&[]);
    let log = dir.join("gt.log");
    let started = Instant::now();
    let out = Command::new(dir.join("bin/workload"))
        .args(["--steps", "6", "--allocs", "2", "--leaks", "1", "--log"])
        .arg(&log)
        .output()
        .unwrap();
    let took = started.elapsed();
    assert!(out.status.success());
    let pid: u32 = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("PID ")?.trim().parse().ok())
        .expect("PID line");
    eprintln!("the job ran for {:.0} ms", took.as_secs_f64() * 1e3);

    let m = wait_exited(&mut agent, &[pid], &dir);
    let comm = m
        .iter()
        .find(|(n, l, _)| n == "memscope_process_exited" && l["pid"] == pid.to_string())
        .map(|(_, l, _)| l["comm"].clone());
    assert_eq!(comm.as_deref(), Some("workload"));
    // The job's own count: the highest step its log names.
    let steps = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter_map(|l| log_fields(l).get("step")?.parse::<u32>().ok())
        .max()
        .unwrap_or(0);
    assert_eq!(of_pid(&m, "memscope_step", pid), Some(steps as f64));
    assert_eq!(steps, 6);
    let (live, allocs) = log_live_by_device(&log);
    assert_eq!(
        of_pid(&m, "memscope_allocations_total", pid),
        Some(allocs as f64)
    );
    assert_eq!(metrics_live_by_device(&m, pid), live);

    let (status, body) = get_bytes(&agent.addr, &format!("/debug/pprof/heap?pid={pid}"));
    assert_eq!(status, 200);
    let profile = dir.join("heap.pb.gz");
    std::fs::write(&profile, body).unwrap();
    let functions = pprof_functions(&profile);
    for f in ["do_alloc", "thread_main"] {
        assert!(
            functions.iter().any(|g| g == f),
            "{f} not among the profile's functions: {functions:?}"
        );
    }
}

/// The real framework under the hold: held at each vendor library it opens (libtorch_npu.so
/// too), it still runs, and every PTA byte is seen. (It passes with `--no-hold` as well: its
/// first tensor comes seconds after its libraries are opened, time enough for the agent.)
#[test]
fn a_torch_npu_job_started_after_the_agent_shows_its_memory_allocated() {
    const TEST: &str = "a_torch_npu_job_started_after_the_agent_shows_its_memory_allocated";
    let Some(venvs) = torch_venvs(TEST) else {
        return;
    };
    let _g = serial();
    let dir = scratch("agent-hold-torch");
    // Its own copy of the simulated CANN, made before the agent starts: files it never saw.
    let cann = dir.join("cann");
    let copied = Command::new("cp")
        .arg("-a")
        .arg(cann_dir())
        .arg(&cann)
        .status()
        .unwrap();
    assert!(copied.success());
    let mut agent = TestAgent::start_with_defaults(&[]);
    let venv = &venvs[0];
    let release = bed_release(venv);
    let (log, hold) = (dir.join("gt.log"), dir.join("hold"));
    let mut job = Command::new(venv.join("bin/python"))
        .arg(torch_script())
        .arg("--log")
        .arg(&log)
        .args(["--steps", "3", "--hold-file"])
        .arg(&hold)
        .env("ASCEND_HOME_PATH", &cann)
        .env("ASCEND_OPP_PATH", cann.join("opp"))
        .env("LD_LIBRARY_PATH", cann.join("lib64"))
        .stdout(Stdio::null())
        .spawn()
        .expect("start python");
    let text = wait_for_text(&log, "DONE", 600);
    let pid: u32 = log_lines(&text, "READY")[0]["pid"].parse().unwrap();
    let end = &log_lines(&text, "EMPTY_CACHE")[0];
    let allocated: u64 = end["allocated"].parse().unwrap();
    assert!(allocated > 0, "{text}");
    let pta = |m: &Samples| -> u64 {
        m.iter()
            .filter(|(n, l, _)| {
                n == "memscope_live_bytes"
                    && l["pid"] == pid.to_string()
                    && l["owner"] == "PTA"
                    && l["device"] == "0"
            })
            .map(|(_, _, v)| *v as u64)
            .sum()
    };
    // The agent is behind by its reorder window and snapshot interval, more under load.
    let deadline = Instant::now() + Duration::from_secs(90);
    let seen = loop {
        let seen = pta(&metrics(&agent));
        if seen == allocated || Instant::now() > deadline {
            break seen;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    std::fs::write(&hold, b"").unwrap();
    assert!(
        job.wait().unwrap().success(),
        "{release}: the script failed\n{text}"
    );
    assert_eq!(
        seen, allocated,
        "{release}: PTA live bytes of pid {pid} vs its memory_allocated()\n{text}"
    );
    let bg = agent.bg.take().unwrap();
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(bg.child.id() as i32, libc::SIGTERM) };
    let (code, log_text) = bg.finish();
    assert_eq!(code, Some(0));
    for l in log_text
        .lines()
        .filter(|l| l.contains(&format!("pid {pid} ")))
    {
        eprintln!("{l}");
    }
}

/// Holds `job` (waiting for `gate`, past its exec) in two tracers at once, the tracer `frozen`
/// made the slower of the two: it is frozen (SIGSTOP) while the job passes its gate and is
/// stopped at its HAL open by both, until `quicker` has ended its hold (its
/// `memscope_agent_holds_total` counts it) and 0.1 s more, or at most 0.7 s in all (under the
/// frozen tracer's 1 s watchdog bound), then thawed. Returns the job's state just before the
/// thaw: `T` while the frozen tracer still holds it. Before holds were shared, the quicker
/// tracer's SIGCONT let the job run its allocations while the other had no probes yet.
fn hold_in_both(frozen: u32, quicker: &TestAgent, job: u32, gate: &Path) -> Option<char> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while process_state(job) != Some('S') {
        assert!(
            Instant::now() < deadline,
            "job {job} never waited at its gate"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let before = global(&metrics(quicker), "memscope_agent_holds_total");
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(frozen as i32, libc::SIGSTOP) };
    let frozen_at = Instant::now();
    std::fs::write(gate, b"").unwrap();
    while frozen_at.elapsed() < Duration::from_millis(600) {
        if global(&metrics(quicker), "memscope_agent_holds_total") > before {
            std::thread::sleep(Duration::from_millis(100));
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let state = process_state(job);
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(frozen as i32, libc::SIGCONT) };
    state
}

/// Two tracers on one node: the agent with its defaults beside a launch-mode session of a job
/// that loads a HAL neither has seen, at once. Both hold the job at the HAL's open until their
/// own probes are in place, the session made the slower one (`hold_in_both`); before holds
/// were shared (`trace/holders.rs`), the agent continued the job first and the session missed
/// its first allocations (14 of 16 in python_stacks.rs, all 12 here, when seen). Every
/// allocation is the session's, and the agent's too. Ground truth: the job's own log.
#[test]
fn a_default_agent_leaves_a_launch_session_whole() {
    const TEST: &str = "a_default_agent_leaves_a_launch_session_whole";
    if !require_root(TEST) {
        return;
    }
    let _g = serial();
    let dir = scratch("agent-beside-session");
    let hal = copies(&dir, "libascend_hal.so", 1).remove(0);
    let mut agent = TestAgent::start_with_defaults(&["--log-level", "debug"]);
    let (log, out, gate) = (dir.join("job.log"), dir.join("out"), dir.join("go"));
    let mut session = Background::spawn(&[
        "-o",
        out.to_str().unwrap(),
        "--",
        fixtures().join("bin/workload_dlopen").to_str().unwrap(),
        "--wait-file",
        gate.to_str().unwrap(),
        "--lib-path",
        hal.to_str().unwrap(),
        "--allocs",
        "12",
        "--log",
        log.to_str().unwrap(),
    ]);
    let pid = session.target_pid();
    let tracer_exe = std::fs::canonicalize(TRACER).unwrap();
    // Past its exec (until then it waits on the session's start gate, not ours).
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == tracer_exe)
        || process_state(pid) != Some('S')
    {
        assert!(Instant::now() < deadline, "the job never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    let state = hold_in_both(session.child.id(), &agent, pid, &gate);
    let (code, session_log) = session.finish();
    assert_eq!(code, Some(0), "{session_log}");
    let (live, allocs) = log_live_by_device(&log);
    assert_eq!(allocs, 12, "{}", log.display());
    let dumps = find_files(&out, "memscope_dump_");
    let dump = dumps.first().expect("no dump: the session saw no call");
    let dump = std::fs::read_to_string(dump).unwrap();
    let traced = dump.lines().filter(|l| l.contains(",MALLOC,HAL,")).count();
    assert_eq!(traced as u64, allocs, "the session's allocations:\n{dump}");
    assert_eq!(state, Some('T'), "the job ran on while the session held it");
    // The agent held it too, and saw the same.
    let m = wait_exited(&mut agent, &[pid], &dir);
    assert_eq!(
        of_pid(&m, "memscope_allocations_total", pid),
        Some(allocs as f64),
        "the agent's count of pid {pid}'s allocations"
    );
    assert_eq!(metrics_live_by_device(&m, pid), live);
    let (code, text) = agent.stop();
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains(&format!("pid {pid} held at a vendor library's open")),
        "the agent never held {pid}:\n{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Two agents with their defaults on one node (a second one started by hand, or two
/// versions during an upgrade) both hold a job at the open of a HAL neither has seen, and it
/// runs on only once both have their probes in place (the second made the slower one,
/// `hold_in_both`): each counts every allocation, the first included. Before holds were
/// shared, the quicker agent's SIGCONT let it run before the other's probes were placed; and
/// each agent held the other at its own read of the library. Ground truth: the job's log.
#[test]
fn two_agents_holding_one_job_both_count_its_first_allocation() {
    const TEST: &str = "two_agents_holding_one_job_both_count_its_first_allocation";
    if !require_root(TEST) {
        return;
    }
    let _g = serial();
    let dir = scratch("two-agents-one-job");
    let hal = copies(&dir, "libascend_hal.so", 1).remove(0);
    let mut agents = [
        TestAgent::start_with_defaults(&["--log-level", "debug"]),
        TestAgent::start_with_defaults(&["--log-level", "debug"]),
    ];
    let (log, gate) = (dir.join("job.log"), dir.join("go"));
    let mut job = Command::new(fixtures().join("bin/workload_dlopen"))
        .arg("--wait-file")
        .arg(&gate)
        .arg("--lib-path")
        .arg(&hal)
        .args(["--allocs", "12", "--log"])
        .arg(&log)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start workload_dlopen");
    let pid = {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(job.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        job_pid(line.as_bytes())
    };
    let state = hold_in_both(agents[1].pid(), &agents[0], pid, &gate);
    assert!(job.wait().unwrap().success());
    let (live, allocs) = log_live_by_device(&log);
    assert_eq!(allocs, 12, "{}", log.display());
    for (i, agent) in agents.iter_mut().enumerate() {
        let m = wait_exited(agent, &[pid], &dir);
        assert_eq!(
            of_pid(&m, "memscope_allocations_total", pid),
            Some(allocs as f64),
            "agent {i}'s count of pid {pid}'s allocations vs {}",
            log.display()
        );
        assert_eq!(metrics_live_by_device(&m, pid), live, "agent {i}");
    }
    assert_eq!(state, Some('T'), "the job ran on while agent 1 held it");
    let logs: Vec<String> = agents
        .into_iter()
        .map(|a| {
            let (code, text) = a.stop();
            assert_eq!(code, Some(0), "{text}");
            text
        })
        .collect();
    let held = format!("pid {pid} held at a vendor library's open");
    assert!(
        logs.iter().all(|t| t.contains(&held)),
        "both agents hold it:\n{}",
        logs.join("\n----\n")
    );
    // The first to be ready left it to the other.
    assert!(
        logs.iter().any(|t| t
            .lines()
            .any(|l| l.contains(&held) && l.contains("another tracer still holding it"))),
        "{}",
        logs.join("\n----\n")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An agent that could not continue another user's job (root without CAP_KILL, as a systemd
/// unit's capability list can make it, cannot signal a process of another user in another
/// session) must hold none: such a job would stay stopped for good, its watchdog no more
/// able than the agent. Ground truth: the job, run as nobody in its own session, gets through.
#[test]
fn an_agent_without_cap_kill_leaves_other_users_jobs_running() {
    const TEST: &str = "an_agent_without_cap_kill_leaves_other_users_jobs_running";
    if !require_root(TEST) {
        return;
    }
    let _g = serial();
    let dir = scratch("agent-no-cap-kill");
    let hal = copies(&dir, "libascend_hal.so", 1).remove(0);
    let addr = free_addr();
    let mut agent = Command::new("setpriv")
        .args(["--bounding-set=-kill", "--inh-caps=-kill", "--"])
        .arg(TRACER)
        .args(["agent", "--listen", &addr, "--snapshot-ms", "200"])
        .stderr(Stdio::null())
        .spawn()
        .expect("run setpriv (util-linux)");
    let deadline = Instant::now() + Duration::from_secs(120);
    while get(&addr, "/ready").map(|(s, _)| s) != Some(200) {
        assert!(Instant::now() < deadline, "the agent never got ready");
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut job = Command::new("setsid")
        .args([
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ])
        .arg(fixtures().join("bin/workload_dlopen"))
        .arg("--lib-path")
        .arg(&hal)
        .args(["--allocs", "3"])
        .stdout(Stdio::null())
        .spawn()
        .expect("start the job as nobody");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = job.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
    assert_eq!(agent.wait().unwrap().code(), Some(0));
    let Some(status) = status else {
        // We are root with CAP_KILL: free it before failing (setsid and setpriv exec it: the
        // job is our child's pid).
        // SAFETY: plain kill(2) on our child.
        unsafe { libc::kill(job.id() as i32, libc::SIGCONT) };
        let _ = job.wait();
        panic!("the job of nobody was left stopped by an agent without CAP_KILL");
    };
    assert!(status.success());
    std::fs::remove_dir_all(&dir).unwrap();
}
