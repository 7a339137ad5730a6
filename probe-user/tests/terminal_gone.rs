//! The tracer survives its terminal (issue 27): stderr that is gone (a reader that quit, a full
//! device, a closed SSH session) costs the messages only, and SIGHUP ends a run as SIGTERM
//! does, with every file written.

mod common;

use std::{
    fs,
    os::fd::{FromRawFd, OwnedFd},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::*;

/// A pipe whose reader has already gone: every write to it fails with EPIPE.
fn closed_pipe() -> Stdio {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills both descriptors; each is owned exactly once below.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    drop(unsafe { OwnedFd::from_raw_fd(fds[0]) });
    Stdio::from(unsafe { OwnedFd::from_raw_fd(fds[1]) })
}

/// Runs the tracer on a short workload with `stderr`; returns its exit code.
fn trace_with_stderr(out_dir: &Path, log: &Path, extra: &[&str], stderr: Stdio) -> Option<i32> {
    let mut args = vec!["-o", out_dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    let workload = bin("workload");
    args.extend_from_slice(&[
        "--",
        workload.to_str().unwrap(),
        "--steps",
        "2",
        "--allocs",
        "2",
        "--leaks",
        "1",
        "--log",
        log.to_str().unwrap(),
    ]);
    Command::new(TRACER)
        .env_remove("SUDO_UID")
        .args(&args)
        .stdout(Stdio::null())
        .stderr(stderr)
        .status()
        .expect("run memscope-bpf")
        .code()
}

#[test]
fn a_console_that_is_gone_costs_only_the_messages() {
    if !require_root("a_console_that_is_gone_costs_only_the_messages") {
        return;
    }
    let dir = scratch("console_gone");

    // `memscope-bpf ... --report 2>&1 | head -1`, with the reader already gone.
    let (out, log) = (dir.join("pipe"), dir.join("pipe.log"));
    let code = trace_with_stderr(&out, &log, &["--report"], closed_pipe());
    assert_eq!(code, Some(0), "exit status with stderr a closed pipe");
    let gt = parse_log(&log);
    assert!(!gt.of("MALLOC").is_empty(), "the program ran");
    let pid = gt.pid;
    let pdir = process_dir(&out, pid).expect("the process directory");
    assert_eq!(
        memory_rows(&rows_of(&out, pid), "MALLOC"),
        gt_rows(&gt, &["MALLOC"]),
        "every allocation has its row"
    );
    assert!(
        pdir.join("report.html").is_file(),
        "report.html is written: {:?}",
        fs::read_dir(&pdir).unwrap().collect::<Vec<_>>()
    );
    assert_eq!(leak_rows(&out, pid), gt_leaks(&gt), "the leak report");

    // `2>/dev/full`: every write fails with ENOSPC.
    let (out, log) = (dir.join("full"), dir.join("full.log"));
    let full = fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let code = trace_with_stderr(&out, &log, &[], Stdio::from(full));
    assert_eq!(code, Some(0), "exit status with stderr on /dev/full");
    let gt = parse_log(&log);
    assert_eq!(
        memory_rows(&rows_of(&out, gt.pid), "MALLOC"),
        gt_rows(&gt, &["MALLOC"])
    );
}

#[test]
fn sighup_detaches_and_writes_everything_as_sigterm_does() {
    if !require_root("sighup_detaches_and_writes_everything_as_sigterm_does") {
        return;
    }
    let dir = scratch("sighup");
    let (out, go) = (dir.join("out"), dir.join("go"));
    let workload = bin("workload");
    // Two blocks live while it waits for `go`: the leak report must list them.
    let mut tracer = Background::spawn(&[
        "-o",
        out.to_str().unwrap(),
        "--",
        workload.to_str().unwrap(),
        "--pre-allocs",
        "2",
        "--wait-file",
        go.to_str().unwrap(),
    ]);
    let pid = tracer.target_pid();
    let go_on_drop = GoOnDrop(go.clone());
    let deadline = Instant::now() + Duration::from_secs(90);
    while process_dir(&out, pid).is_none() || memory_rows(&rows_of(&out, pid), "MALLOC").len() < 2 {
        assert!(
            Instant::now() < deadline,
            "the two allocations never got rows"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: signalling our own child (as the terminal's hangup would).
    unsafe { libc::kill(tracer.child.id() as i32, libc::SIGHUP) };
    let (code, stderr) = tracer.finish();
    assert_eq!(code, Some(128 + libc::SIGHUP), "{stderr}");
    assert!(stderr.contains("received SIGHUP"), "{stderr}");
    let leaks = leak_rows(&out, pid);
    assert_eq!(
        leaks.len(),
        2,
        "both live blocks reported: {leaks:?}\n{stderr}"
    );
    // The target was left alone: still waiting, and it finishes once let go.
    assert_eq!(process_state(pid).map(|s| s != 'Z'), Some(true));
    drop(go_on_drop);
    let deadline = Instant::now() + Duration::from_secs(60);
    while process_state(pid).is_some_and(|s| s != 'Z') {
        assert!(Instant::now() < deadline, "the target never finished");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Lets the gated workload go however the test ends (it polls for the file, which must stay
/// until it has seen it: the scratch directory goes only after this).
struct GoOnDrop(std::path::PathBuf);

impl Drop for GoOnDrop {
    fn drop(&mut self) {
        let _ = fs::write(&self.0, b"");
    }
}
