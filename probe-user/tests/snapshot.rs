//! `--snapshot`: the PyTorch memory snapshot memscope-bpf writes from outside the process,
//! against the one torch_npu writes from inside (`torch_npu.npu.memory._record_memory_history()`
//! and `_dump_snapshot()` in tests/fixtures/python/torch_npu_train.py --snapshot) on the
//! released wheels of the test bed, and drawn by the torch wheel's own `_memory_viz.py`
//! (tests/tools/snapshot_check.py does both in the venv's Python).

mod common;

use std::{
    fs,
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
/// script lines as torch_npu's own snapshot; and memory_viz draws ours.
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
            .args(["-o", out_dir.to_str().unwrap(), "--snapshot", "--"])
            .arg(venv.join("bin/python"))
            .arg(torch_script())
            .args(["--log", log.to_str().unwrap(), "--steps", "5", "--keep-cache"])
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
            ],
        );
        eprintln!("{release}: {compared}");
        let drawn = dir.join("viz");
        let rendered = check(
            venv,
            &["render", ours.to_str().unwrap(), drawn.to_str().unwrap()],
        );
        eprintln!("{release}: {rendered}");
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
    let mut target = Command::new(venv.join("bin/python"))
        .arg(torch_script())
        .args(["--log", log.to_str().unwrap(), "--steps", "5"])
        .args(["--wait-file", go.to_str().unwrap()])
        .args(["--hold-file", hold.to_str().unwrap()])
        .envs(cann_env())
        .current_dir(&dir)
        .stdout(Stdio::null())
        .spawn()
        .expect("start python");
    let text = wait_for_text(&log, "READY", 180);
    let pid: u32 = log_lines(&text, "READY")[0]["pid"].parse().unwrap();
    let mut tracer = Background::spawn(&[
        "-o",
        out_dir.to_str().unwrap(),
        "--snapshot",
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
    let mut kept: Vec<u64> = log_lines(&text, "LEAK")
        .iter()
        .map(|f| hex(f["ptr"]))
        .collect();
    kept.sort();
    assert_eq!(kept.len(), 3, "{text}");
    let read = Command::new(venv.join("bin/python"))
        .args([
            "-c",
            "import pickle,sys; s=pickle.load(open(sys.argv[1],'rb')); \
             print(s['memscope_bpf']['attached'], sorted(b['address'] for g in s['segments'] \
             for b in g['blocks'] if b['state']=='active_allocated'))",
        ])
        .arg(&live)
        .output()
        .unwrap();
    assert!(read.status.success());
    assert_eq!(
        String::from_utf8_lossy(&read.stdout).trim(),
        format!("True {kept:?}"),
        "the live snapshot's blocks against the script's kept tensors"
    );
    fs::write(&hold, b"").unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while target.try_wait().unwrap().is_none() {
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
