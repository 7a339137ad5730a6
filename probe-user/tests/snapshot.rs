//! `--memory-snapshot`: the PyTorch memory snapshot memscope-bpf writes from outside the process,
//! against the one torch_npu writes from inside (`torch_npu.npu.memory._record_memory_history()`
//! and `_dump_snapshot()` in tests/fixtures/python/torch_npu_train.py --snapshot) on the
//! released wheels of the test bed, and drawn by the torch wheel's own `_memory_viz.py`
//! (tests/tools/snapshot_check.py does both in the venv's Python).

mod common;

use std::{
    fs,
    io::{Read, Write},
    net::TcpStream,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::*;

fn checker() -> std::path::PathBuf {
    repo_root().join("tests/tools/snapshot_check.py")
}

/// `python snapshot_check.py ARGS` in `venv`; panics with its output unless it succeeds.
fn check(venv: &Path, args: &[&str]) -> String {
    let out = Command::new(venv.join("bin/python"))
        .arg(checker())
        .args(args)
        // Only torch's _memory_viz.py is imported: not the NPU backend (no CANN needed).
        .env("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
        .output()
        .expect("run snapshot_check.py");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{}: snapshot_check.py {args:?} failed:\n{text}",
        bed_release(venv)
    );
    text
}

/// Launch mode, from the first tensor to the end: the same segments, blocks, actions and
/// script lines as torch_npu's own snapshot, and C frames with file:line that torch_npu's own
/// unwinder found too; and memory_viz draws ours.
#[test]
fn snapshot_matches_torch_npus_own() {
    let Some(venvs) = torch_venvs("snapshot_matches_torch_npus_own") else {
        return;
    };
    let _serial = serial();
    for venv in &venvs {
        let release = bed_release(venv);
        let dir = scratch(&format!("snapshot-{release}"));
        let out_dir = dir.join("out");
        let theirs = dir.join("theirs.pickle");
        let log = dir.join("gt.log");
        let out = Command::new(TRACER)
            .env_remove("SUDO_UID")
            .args(["-o", out_dir.to_str().unwrap(), "--memory-snapshot"])
            .arg("--call-stack=c,python")
            .arg("--")
            .arg(venv.join("bin/python"))
            .arg(torch_script())
            .args([
                "--log",
                log.to_str().unwrap(),
                "--steps",
                "5",
                "--keep-cache",
            ])
            .args(["--snapshot", theirs.to_str().unwrap()])
            .envs(cann_env())
            // torch_npu's _dump_snapshot also leaves a device_0_memUsageInfo_<time>.csv in
            // the working directory.
            .current_dir(&dir)
            .output()
            .expect("run memscope-bpf");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{release}: tracer failed:\n{stderr}");
        let pid: u32 = log_lines(&fs::read_to_string(&log).unwrap(), "READY")[0]["pid"]
            .parse()
            .unwrap();
        let ours = process_dir(&out_dir, pid)
            .unwrap()
            .join("memory_snapshot.pickle");
        assert!(
            ours.is_file(),
            "{release}: no {}:\n{stderr}",
            ours.display()
        );
        let script = torch_script();
        let compared = check(
            venv,
            &[
                "compare",
                ours.to_str().unwrap(),
                theirs.to_str().unwrap(),
                script.to_str().unwrap(),
                "--c-frames",
            ],
        );
        eprintln!("{release}: {compared}");
        let drawn = dir.join("viz");
        let rendered = check(
            venv,
            &["render", ours.to_str().unwrap(), drawn.to_str().unwrap()],
        );
        eprintln!("{release}: {rendered}");
        if let Some(viz) = memory_viz_viewer() {
            viewer_draws_ours_as_theirs(venv, &viz, &drawn, &ours, &theirs);
        }
    }
}

/// PyTorch's memory_viz viewer (torch/utils/viz/MemoryViz.js, which the wheel does not ship:
/// the pages it writes load it and d3 5 from CDNs) and d3 5's bundle, in
/// `$MEMSCOPE_MEMORY_VIZ` or ~/.cache/memscope-bpf/memory_viz (docs/report.md says how to
/// put them there); without them the Chromium part is SKIPPED, loudly.
fn memory_viz_viewer() -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("MEMSCOPE_MEMORY_VIZ")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/memscope-bpf/memory_viz"))
        })?;
    if ["MemoryViz.js", "d3.min.js"]
        .iter()
        .all(|f| dir.join(f).is_file())
    {
        return Some(dir);
    }
    eprintln!(
        "SKIPPED the memory_viz pages in Chromium: no MemoryViz.js and d3.min.js in {}",
        dir.display()
    );
    println!("SKIPPED memory_viz in Chromium: no viewer files");
    None
}

/// The memory_viz viewer in headless Chromium, each view, on our snapshot's own bytes and on
/// torch_npu's: no console error, and the same picture (as many polygons, rectangles and
/// event lines); and the pages torch's trace_plot and segment_plot wrote open too.
fn viewer_draws_ours_as_theirs(venv: &Path, viz: &Path, drawn: &Path, ours: &Path, theirs: &Path) {
    use common::chromium::{dump_dom, require_chromium};
    if !require_chromium("snapshot_matches_torch_npus_own") {
        return;
    }
    check(
        venv,
        &[
            "pages",
            drawn.to_str().unwrap(),
            viz.to_str().unwrap(),
            ours.to_str().unwrap(),
            theirs.to_str().unwrap(),
        ],
    );
    let profile = drawn.join("chromium-profile");
    let shape = |dom: &str| ["<polygon", "<rect", "<pre"].map(|tag| dom.matches(tag).count());
    for view in ["timeline", "state", "segments"] {
        let ours = shape(&dump_dom(
            &drawn.join(format!("ours_{view}.html")),
            &profile,
        ));
        let theirs = shape(&dump_dom(
            &drawn.join(format!("theirs_{view}.html")),
            &profile,
        ));
        eprintln!("memory_viz {view}: ours {ours:?}, theirs {theirs:?}");
        assert_eq!(
            ours, theirs,
            "memory_viz's {view} view: polygons, rects, lines"
        );
        assert!(ours.iter().sum::<usize>() > 2, "{view}: nothing drawn");
    }
    for page in ["torch_trace_plot", "torch_segment_plot"] {
        let dom = dump_dom(&drawn.join(format!("{page}.html")), &profile);
        assert!(
            shape(&dom).iter().sum::<usize>() > 2,
            "{page}: nothing drawn"
        );
    }
}

/// `--pid` and SIGUSR1: the snapshot of a running job holds exactly the tensors it keeps
/// (its own log says which), says it was attached, and the run's end writes one more.
#[test]
fn sigusr1_snapshots_a_running_job() {
    let Some(venvs) = torch_venvs("sigusr1_snapshots_a_running_job") else {
        return;
    };
    let _serial = serial();
    let venv = &venvs[venvs.len() - 1];
    let dir = scratch("snapshot-sigusr1");
    let out_dir = dir.join("out");
    let log = dir.join("gt.log");
    let (go, hold) = (dir.join("go"), dir.join("hold"));
    // A failed check must not leave the job held (nor the tracer waiting for it).
    let mut target = StopOnDrop(
        Command::new(venv.join("bin/python"))
            .arg(torch_script())
            .args(["--log", log.to_str().unwrap(), "--steps", "5"])
            .args(["--wait-file", go.to_str().unwrap()])
            .args(["--hold-file", hold.to_str().unwrap()])
            .envs(cann_env())
            .current_dir(&dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("start python"),
    );
    let text = wait_for_text(&log, "READY", 180);
    let pid: u32 = log_lines(&text, "READY")[0]["pid"].parse().unwrap();
    let mut tracer = Background::spawn(&[
        "-o",
        out_dir.to_str().unwrap(),
        "--memory-snapshot",
        "--pid",
        &pid.to_string(),
    ]);
    tracer.wait_for("attached to pid", 120);
    fs::write(&go, b"").unwrap();
    let text = wait_for_text(&log, "DONE", 300);
    // The last rows leave the tracer's reorder window (50 ms) before the signal.
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(tracer.child.id() as i32, libc::SIGUSR1) };
    tracer.wait_for("memory snapshot", 60);
    let line = tracer.seen_line("memory snapshot").to_owned();
    assert_eq!(process_state(pid).map(|s| s != 'Z'), Some(true), "{line}");
    let live = fs::read_dir(process_dir(&out_dir, pid).unwrap())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("memory_snapshot_")
        })
        .unwrap_or_else(|| panic!("no memory_snapshot_<time>.pickle; {line}"));
    let kept = kept_tensors(&text);
    assert_eq!(
        live_blocks(venv, &fs::read(&live).unwrap()),
        (true, kept),
        "the live snapshot's blocks against the script's kept tensors"
    );
    fs::write(&hold, b"").unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while target.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the script did not end");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, stderr) = tracer.finish();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        process_dir(&out_dir, pid)
            .unwrap()
            .join("memory_snapshot.pickle")
            .is_file(),
        "{stderr}"
    );
}

/// The tensors the script keeps to its end (its LEAK lines), sorted.
fn kept_tensors(log: &str) -> Vec<u64> {
    let mut kept: Vec<u64> = log_lines(log, "LEAK")
        .iter()
        .map(|f| hex(f["ptr"]))
        .collect();
    kept.sort();
    assert_eq!(kept.len(), 3, "{log}");
    kept
}

/// A snapshot's `memscope_bpf.attached` and its live blocks' addresses, as Python's pickle
/// reads them.
fn live_blocks(venv: &Path, pickle: &[u8]) -> (bool, Vec<u64>) {
    let mut child = Command::new(venv.join("bin/python"))
        .args([
            "-c",
            "import pickle,sys; s=pickle.load(sys.stdin.buffer); \
             print(s['memscope_bpf']['attached'], *sorted(b['address'] for g in s['segments'] \
             for b in g['blocks'] if b['state']=='active_allocated'))",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(pickle).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "not a pickle Python reads");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace();
    let attached = words.next() == Some("True");
    (attached, words.map(|w| w.parse().unwrap()).collect())
}

/// One HTTP GET: (status, body).
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
    let status = String::from_utf8_lossy(&all[..split])
        .split(' ')
        .nth(1)?
        .parse()
        .ok()?;
    Some((status, all[split + 4..].to_vec()))
}

/// Ends a helper process however the test ends: the agent (SIGTERM, it detaches) or the job.
struct StopOnDrop(std::process::Child);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        // SAFETY: plain kill(2) on our child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// The node agent with --memory-snapshot serves a running job's snapshot over HTTP: its live
/// blocks are exactly the tensors the job keeps.
#[test]
fn agent_serves_a_running_jobs_memory_snapshot() {
    let Some(venvs) = torch_venvs("agent_serves_a_running_jobs_memory_snapshot") else {
        return;
    };
    let _serial = serial();
    let venv = &venvs[venvs.len() - 1];
    let dir = scratch("snapshot-agent");
    let lib64 = cann_dir().join("lib64");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let _agent = StopOnDrop(
        Command::new(TRACER)
            .args(["agent", "--listen", &addr, "--memory-snapshot"])
            .arg("--lib")
            .arg(lib64.join("libascend_hal.so"))
            .arg("--lib")
            .arg(lib64.join("libascendcl.so"))
            .stderr(Stdio::null())
            .spawn()
            .expect("start the agent"),
    );
    let deadline = Instant::now() + Duration::from_secs(180);
    while get(&addr, "/ready").map(|r| r.0) != Some(200) {
        assert!(Instant::now() < deadline, "the agent never got ready");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (log, go, hold) = (dir.join("gt.log"), dir.join("go"), dir.join("hold"));
    let mut job = StopOnDrop(
        Command::new(venv.join("bin/python"))
            .arg(torch_script())
            .args(["--log", log.to_str().unwrap(), "--steps", "5"])
            .args(["--wait-file", go.to_str().unwrap()])
            .args(["--hold-file", hold.to_str().unwrap()])
            .envs(cann_env())
            .current_dir(&dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("start python"),
    );
    let text = wait_for_text(&log, "READY", 300);
    let pid: u32 = log_lines(&text, "READY")[0]["pid"].parse().unwrap();
    // Picked up (its lazy init) before its first tensor.
    let seen = format!("pid=\"{pid}\"");
    let deadline = Instant::now() + Duration::from_secs(180);
    while !get(&addr, "/metrics")
        .is_some_and(|(_, body)| String::from_utf8_lossy(&body).contains(&seen))
    {
        assert!(Instant::now() < deadline, "the agent never picked up {pid}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        get(&addr, "/debug/memory_snapshot?pid=x").map(|r| r.0),
        Some(400)
    );
    fs::write(&go, b"").unwrap();
    let text = wait_for_text(&log, "DONE", 300);
    let kept = kept_tensors(&text);
    // The agent is behind by its reorder window, more under load.
    let path = format!("/debug/memory_snapshot?pid={pid}");
    let deadline = Instant::now() + Duration::from_secs(90);
    let got = loop {
        let got = match get(&addr, &path) {
            Some((200, body)) => Some(live_blocks(venv, &body)),
            _ => None,
        };
        if got.as_ref() == Some(&(true, kept.clone())) || Instant::now() > deadline {
            break got;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(got, Some((true, kept)), "the agent's snapshot of {pid}");
    fs::write(&hold, b"").unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while job.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the script did not end");
        std::thread::sleep(Duration::from_millis(50));
    }
}
