//! A probed library written in place (`cp` over it: the same inode, new contents) while a
//! tracer runs. The kernel keeps each probed instruction as it copied it from the file, for
//! as long as a probe stays at that offset: unless the tracer drops its probes at the write,
//! every process that maps the new file runs the old file's bytes there. The untraced
//! programs here are the judges (they must run to their end with their own allocations), and
//! the tracers must count the rewritten file's calls from their first. Ground truth: each
//! program's own log.

mod common;

use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::Command,
};

use common::{agent::*, *};

/// `dir/vendor/libascend_hal.so`, a copy of the simulated HAL in a directory on no search
/// path, and the bytes of a shared object with none of its functions (the stand-in).
fn hal_and_stand_in(dir: &Path) -> (PathBuf, Vec<u8>) {
    let vendor = dir.join("vendor");
    fs::create_dir_all(&vendor).unwrap();
    let hal = vendor.join("libascend_hal.so");
    fs::copy(fixtures().join("lib/libascend_hal.so"), &hal).unwrap();
    (hal, fs::read(fixtures().join("lib/libplugin.so")).unwrap())
}

/// Writes `bytes` over `path` in place, as `cp` does (truncated, rewritten: the same inode).
fn write_in_place(path: &Path, bytes: &[u8]) {
    let inode = fs::metadata(path).unwrap().ino();
    fs::write(path, bytes).unwrap();
    assert_eq!(fs::metadata(path).unwrap().ino(), inode, "not in place");
}

/// Runs `workload_dlopen` untraced by any session: it opens `first` (if any), then the HAL at
/// `hal` and makes `allocs` allocations; returns its pid, exit code and ground-truth log.
fn run_job(
    dir: &Path,
    tag: &str,
    first: Option<&Path>,
    hal: &Path,
    allocs: u32,
) -> (u32, Option<i32>, PathBuf) {
    let log = dir.join(format!("{tag}.log"));
    let mut c = Command::new(bin("workload_dlopen"));
    if let Some(first) = first {
        c.arg("--first").arg(first);
    }
    let out = c
        .arg("--lib-path")
        .arg(hal)
        .args(["--allocs", &allocs.to_string(), "--log"])
        .arg(&log)
        .output()
        .expect("run workload_dlopen");
    (job_pid(&out.stdout), out.status.code(), log)
}

fn allocations_of(agent: &TestAgent, pid: u32) -> Option<f64> {
    let (status, body) = get(&agent.addr, "/metrics").expect("GET /metrics");
    assert_eq!(status, 200);
    of_pid(&samples(&body), "memscope_allocations_total", pid)
}

/// The agent's probes are system-wide and last as long as it runs: an update of a library in
/// place would break every later user of it on the node. The agent probes a vendor library
/// when any process opens it (here `cat`: nothing maps it, so the kernel copies no
/// instruction yet); the file is then rewritten with a stand-in, which a program maps (the
/// kernel copies the stand-in's bytes as the probed instructions, if the probes are still
/// there), and the HAL is put back. Seen before the fix: the HAL's next user killed by SIGSEGV
/// in the kernel's out-of-line slot, running the stand-in's zero bytes as `halMemAlloc`'s
/// first instruction.
#[test]
fn an_agent_drops_its_probes_from_a_library_written_in_place() {
    const TEST: &str = "an_agent_drops_its_probes_from_a_library_written_in_place";
    if !require_root(TEST) {
        return;
    }
    let _g = serial();
    let dir = scratch("rewritten-agent");
    let (hal, stand_in) = hal_and_stand_in(&dir);
    let real = fs::read(&hal).unwrap();
    let mut agent = TestAgent::start_with_defaults(&["--log-level", "debug"]);

    let read = Command::new("cat").arg(&hal).output().unwrap();
    assert_eq!(read.stdout, real);
    let bg = agent.bg.as_mut().unwrap();
    bg.wait_for(&format!("probe halMemAlloc at {}", hal.display()), 30);

    // Updated in place: the agent says its probes are gone before anyone maps the new file.
    write_in_place(&hal, &stand_in);
    bg.wait_for("was written to while probed", 30);
    let line = bg.seen_line("was written to while probed").to_string();
    assert!(line.contains(hal.to_str().unwrap()), "{line}");
    let fixture_hal = fixtures().join("lib/libascend_hal.so");
    let (_, code, _) = run_job(&dir, "stand-in", Some(&hal), &fixture_hal, 1);
    assert_eq!(code, Some(0), "the program that mapped the stand-in");
    write_in_place(&hal, &real);

    // The next user of the file runs right, and the agent has it from its first call.
    let (last, code, log) = run_job(&dir, "last", None, &hal, 3);
    assert_eq!(code, Some(0), "the HAL's next user did not run to its end");
    let gt = parse_log(&log);
    assert_eq!(gt.pid, last);
    assert_eq!(gt.of("MALLOC").len(), 3);
    agent.wait_reported_exit(last);
    assert_eq!(
        allocations_of(&agent, last),
        Some(3.0),
        "the agent's count of {last}"
    );
    let (code, text) = agent.stop();
    assert_eq!(code, Some(0), "{text}");
    fs::remove_dir_all(&dir).unwrap();
}

/// A launch session's probes live as long as its run: the file, rewritten while its program
/// waits, loses them, and the program's open of it stops it until the file is planned again,
/// so every call is seen. Through multi-uprobe links and through perf links (kernels before
/// 6.6), which are kept apart.
#[test]
fn a_session_plans_a_library_written_in_place_again() {
    const TEST: &str = "a_session_plans_a_library_written_in_place_again";
    if !require_root(TEST) {
        return;
    }
    let _g = serial();
    let root = scratch("rewritten-session");
    for (links, env) in [
        ("multi", &[][..]),
        ("perf", &[("MEMSCOPE_BPF_NO_MULTI_UPROBE", "1")][..]),
    ] {
        let dir = root.join(links);
        let (hal, stand_in) = hal_and_stand_in(&dir);
        let real = fs::read(&hal).unwrap();
        let (log, out, gate) = (dir.join("job.log"), dir.join("out"), dir.join("go"));
        let mut session = Background::spawn_with_env(
            &[
                "--log-level=debug",
                "--lib",
                hal.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
                "--",
                bin("workload_dlopen").to_str().unwrap(),
                "--wait-file",
                gate.to_str().unwrap(),
                "--lib-path",
                hal.to_str().unwrap(),
                "--allocs",
                "4",
                "--log",
                log.to_str().unwrap(),
            ],
            env,
        );
        // Passing or not, the program goes through its gate at the end, and the session
        // with it.
        let _gate = GoOnDrop(gate.clone());
        let pid = session.target_pid();
        session.wait_for(&format!("pid {pid} resumed after attaching"), 60);
        write_in_place(&hal, &stand_in);
        session.wait_for("was written to while probed", 30);
        let line = session.seen_line("was written to while probed");
        assert!(line.contains(hal.to_str().unwrap()), "{links}: {line}");
        write_in_place(&hal, &real);
        fs::write(&gate, b"").unwrap();
        let (code, stderr) = session.finish();
        assert_eq!(code, Some(0), "{links}: {stderr}");
        assert!(
            stderr.contains(&format!("pid {pid} stopped at open of {}", hal.display())),
            "{links}: the program was not held at its open of the rewritten file:\n{stderr}"
        );
        let gt = parse_log(&log);
        assert_eq!(gt.of("MALLOC").len(), 4);
        let rows = rows_of(&out, gt.pid);
        for kind in ["MALLOC", "FREE"] {
            assert_eq!(
                memory_rows(&rows, kind),
                gt_rows(&gt, &[kind]),
                "{links}: {stderr}"
            );
        }
    }
    fs::remove_dir_all(&root).unwrap();
}
