//! Safe under attack and failure (issue 15): what a careless or hostile user can do to a
//! tracer that runs as root, and faults of the machine (a full disk, a killed tracer).
//! Most of these need root (to own files as another user, mount a tmpfs, load BPF); without
//! it they print SKIPPED.

mod common;

use std::{
    fs,
    io::{BufRead, BufReader},
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use common::{TRACER, find_files, scratch};
use memscope_bpf::output::csv::CSV_HEADER;

/// The unprivileged user the attacks run as.
const NOBODY: u32 = 65534;

fn is_root(test: &str) -> bool {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    eprintln!("SKIPPED {test}: needs root (acts as another user)");
    println!("SKIPPED {test}: needs root");
    false
}

fn chown(p: &Path, uid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(uid)).unwrap();
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// A root-only directory with one file: what the attacker wants us to write into or chmod.
fn victim(dir: &Path) -> PathBuf {
    let v = dir.join("victim");
    fs::create_dir(&v).unwrap();
    fs::write(v.join("secret"), "root only\n").unwrap();
    fs::set_permissions(&v, fs::Permissions::from_mode(0o700)).unwrap();
    v
}

fn assert_untouched(v: &Path) {
    assert_eq!(mode(v), 0o700, "victim directory mode changed");
    let names: Vec<String> = fs::read_dir(v)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["secret"], "something was written into the victim");
    assert_eq!(mode(&v.join("secret")), 0o644);
}

/// A dump with one HAL block never freed (pid 77): `analyze` writes a process directory.
fn leaky_dump(dir: &Path) -> PathBuf {
    let p = dir.join("memscope_dump_1.csv");
    fs::write(
        &p,
        format!(
            "{CSV_HEADER}\n\
             0,MALLOC,HAL,N/A,10,77,78,0,0x0000124000000000,\"{{allocation_id:1,addr:0x0000124000000000,size:4096,used:4096,page_type:normal,alloc_type:alloc}}\",,\n"
        ),
    )
    .unwrap();
    p
}

fn analyze(dump: &Path, out: &Path, sudo_uid: Option<u32>) -> std::process::Output {
    let mut cmd = Command::new(TRACER);
    cmd.arg("analyze")
        .arg(format!("--input-path={}", dump.display()))
        .arg("-o")
        .arg(out);
    match sudo_uid {
        Some(u) => cmd
            .env("SUDO_UID", u.to_string())
            .env("SUDO_GID", u.to_string()),
        None => cmd.env_remove("SUDO_UID").env_remove("SUDO_GID"),
    };
    cmd.output().expect("run memscope-bpf")
}

fn stderr_of(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A scratch directory other users can traverse.
fn open_scratch(name: &str) -> common::Scratch {
    let d = scratch(name);
    fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
    d
}

#[test]
fn symlinked_or_foreign_output_root_is_refused() {
    if !is_root("symlinked_or_foreign_output_root_is_refused") {
        return;
    }
    // The whole binary runs one test at a time: its races are timed against each other.
    let _serial = common::serial();
    let dir = open_scratch("safety-root");
    let v = victim(&dir);
    let dump = leaky_dump(&dir);
    // The user's own directory, where they planted links to the victim.
    let home = dir.join("home");
    fs::create_dir(&home).unwrap();
    chown(&home, NOBODY);
    let link = home.join("memscopeDumpResults");
    std::os::unix::fs::symlink(&v, &link).unwrap();
    chown(&link, NOBODY);
    let mid = home.join("mid");
    std::os::unix::fs::symlink(&v, &mid).unwrap();
    chown(&mid, NOBODY);
    for out in [link.clone(), mid.join("sub")] {
        let o = analyze(&dump, &out, Some(NOBODY));
        let err = stderr_of(&o);
        assert_eq!(o.status.code(), Some(2), "-o {}: {err}", out.display());
        assert!(err.contains("refusing to follow symlink"), "{err}");
        assert_untouched(&v);
    }
    // A directory of another user, run by root without sudo on that user's behalf.
    let o = analyze(&dump, &home, None);
    let err = stderr_of(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("owned by uid 65534"), "{err}");
    assert!(find_files(&home, "leaks_").is_empty());
    // Run for that user (sudo), it is theirs to write into.
    let o = analyze(&dump, &home, Some(NOBODY));
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    assert_eq!(find_files(&home, "leaks_").len(), 1);
    // A symlink of root's own is followed.
    let real = dir.join("real");
    fs::create_dir(&real).unwrap();
    std::os::unix::fs::symlink(&real, dir.join("rootlink")).unwrap();
    let o = analyze(&dump, &dir.join("rootlink/out"), None);
    assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    assert_eq!(find_files(&real.join("out"), "leaks_").len(), 1);
    assert_untouched(&v);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn analyze_twice_in_one_second_writes_two_directories() {
    // The whole binary runs one test at a time: its races are timed against each other.
    let _serial = common::serial();
    let dir = scratch("safety-twice");
    let dump = leaky_dump(&dir);
    let out = dir.join("out");
    // Four runs back to back: at least two share a second.
    for _ in 0..4 {
        let o = analyze(&dump, &out, None);
        assert_eq!(o.status.code(), Some(0), "{}", stderr_of(&o));
    }
    let leaks = find_files(&out, "leaks_");
    assert_eq!(leaks.len(), 4, "{leaks:?}");
    let dirs: std::collections::BTreeSet<_> = leaks
        .iter()
        .map(|p| p.ancestors().nth(3).unwrap().to_path_buf())
        .collect();
    assert_eq!(dirs.len(), 4, "{dirs:?}");
    for d in &dirs {
        let name = d.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with("msmemscope_77_") && name.ends_with("_ascend"),
            "{name}"
        );
        assert!(d.join("config.json").is_file());
    }
    fs::remove_dir_all(&dir).unwrap();
}

/// The attacker owns the output directory (the tracer runs under `sudo` for them) and swaps
/// each freshly created `msmemscope_*` directory for a symlink to a root-only directory, from
/// an inotify watcher running as that user.
#[test]
fn swapped_result_directory_is_not_followed() {
    if !is_root("swapped_result_directory_is_not_followed") {
        return;
    }
    const RUNS: usize = 30;
    // Alone among the tracing tests: under their load the attacker wins every race, and the
    // runs that keep writing into their moved directory (checked below) never happen.
    let _serial = common::serial();
    let dir = open_scratch("safety-race");
    let v = victim(&dir);
    let dump = leaky_dump(&dir);
    let out = dir.join("out");
    fs::create_dir(&out).unwrap();
    chown(&out, NOBODY);
    let watcher = dir.join("swap_watcher");
    let cc = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&watcher)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/safety/swap_watcher.c"))
        .output()
        .expect("run cc");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let mut child = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--no-new-privs",
        ])
        .arg(&watcher)
        .arg(&out)
        .arg(&v)
        .arg(RUNS.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run setpriv");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "watching");
    let mut failures = Vec::new();
    for _ in 0..RUNS {
        let o = analyze(&dump, &out, Some(NOBODY));
        if o.status.code() != Some(0) {
            failures.push(stderr_of(&o));
        }
    }
    let _ = fs::write(out.join("stop"), "");
    let status = child.wait().unwrap();
    let swaps = lines
        .map_while(Result::ok)
        .filter(|l| l.starts_with("swapped"))
        .count();
    assert!(status.success());
    assert_untouched(&v);
    // The watcher swapped directories away (it stops after RUNS swaps; a run whose directory
    // went before we opened it makes another), and every run wrote into a directory of its
    // own wherever that went: root's, mode 0750.
    assert_eq!(
        swaps, RUNS,
        "the watcher swapped {swaps} of {RUNS} directories"
    );
    assert!(
        failures.is_empty(),
        "{} run(s) failed: {failures:?}",
        failures.len()
    );
    assert_eq!(find_files(&out, "leaks_").len(), RUNS);
    let mut written_in_moved = 0;
    for k in 0..RUNS {
        let moved = out.join(format!("moved-{k}"));
        assert_eq!(fs::symlink_metadata(&moved).unwrap().uid(), 0);
        assert_eq!(mode(&moved), 0o750);
        if moved.join("config.json").is_file() {
            written_in_moved += 1;
        }
    }
    eprintln!("{written_in_moved} of {RUNS} runs kept writing into their moved directory");
    assert!(written_in_moved > 0);
    fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// A full disk
// ---------------------------------------------------------------------------------------------

/// A small tmpfs, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        fs::create_dir_all(at).unwrap();
        let st = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs at {}", at.display());
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The dump CSV of the only process directory under `out`: checks it is whole (header, every
/// record 12 fields, ends with a newline) and returns its rows.
fn whole_dump(out: &Path) -> (PathBuf, Vec<common::DumpRow>) {
    let dumps = find_files(out, "memscope_dump_");
    assert_eq!(dumps.len(), 1, "{dumps:?}");
    let text = fs::read_to_string(&dumps[0]).unwrap();
    assert!(
        text.ends_with('\n'),
        "the CSV ends mid-row: {:?}",
        &text[text.len().saturating_sub(80)..]
    );
    for r in common::parse_dump_records(&text) {
        assert_eq!(r.len(), 12, "{r:?}");
    }
    let rows = common::parse_dump(&dumps[0]);
    (dumps[0].clone(), rows)
}

/// Rows the workload's log says it caused: its HAL calls and mstx marks/ranges, plus its one
/// aclInit and one aclFinalize (SYSTEM rows).
fn expected_rows(gt: &common::GroundTruth) -> u64 {
    (gt.of("MALLOC").len()
        + gt.of("FREE").len()
        + gt.marks.len()
        + gt.range_starts.len()
        + gt.range_ends
        + 2) as u64
}

/// The number after `but ` in the summary `N events, but M row(s) could not be written`.
fn rows_lost(stderr: &str) -> u64 {
    stderr
        .lines()
        .find_map(|l| {
            l.split_once(", but ")?
                .1
                .split_once(" row(s) could not be written")
        })
        .map(|(n, _)| n.parse().unwrap())
        .unwrap_or_else(|| panic!("no loss summary in {stderr}"))
}

#[test]
fn full_disk_mid_run_keeps_rows_whole_and_reports_the_loss() {
    if !common::require_root("full_disk_mid_run_keeps_rows_whole_and_reports_the_loss") {
        return;
    }
    let _serial = common::serial();
    let dir = scratch("safety-full");
    let mnt = Tmpfs::mount(&dir.join("mnt"), "256k");
    let log = dir.join("gt.log");
    let out = common::run_tracer(&[
        "-o",
        mnt.0.to_str().unwrap(),
        "--",
        common::bin("workload").to_str().unwrap(),
        "--steps",
        "20",
        "--allocs",
        "100",
        "--leaks",
        "0",
        "--log",
        log.to_str().unwrap(),
    ]);
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    // One error when writing starts to fail, not one per row.
    let reported = err.lines().filter(|l| l.contains("No space left")).count();
    assert_eq!(reported, 2, "the error and the summary only:\n{err}");
    assert!(!err.contains("none lost"), "{err}");
    let (dump, rows) = whole_dump(&mnt.0);
    let gt = common::parse_log(&log);
    let lost = rows_lost(&err);
    assert!(
        lost > 0 && !rows.is_empty(),
        "{lost} lost, {} written",
        rows.len()
    );
    assert_eq!(rows.len() as u64 + lost, expected_rows(&gt));
    // The rows that made it are the workload's first calls, in order.
    let hal: Vec<(String, u64)> = rows
        .iter()
        .filter(|r| r.event_type == "HAL")
        .map(|r| (r.event.clone(), r.addr()))
        .collect();
    let gt_hal: Vec<(String, u64)> = gt
        .blocks
        .iter()
        .filter(|b| b.kind == "MALLOC" || b.kind == "FREE")
        .map(|b| (b.kind.clone(), b.addr))
        .take(hal.len())
        .collect();
    assert_eq!(hal, gt_hal);
    // Our own reader takes the cut file.
    let a = analyze(&dump, &dir.join("analysis"), None);
    assert_eq!(a.status.code(), Some(0), "{}", stderr_of(&a));
    drop(mnt);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn writing_resumes_when_space_returns() {
    if !common::require_root("writing_resumes_when_space_returns") {
        return;
    }
    let _serial = common::serial();
    let dir = scratch("safety-recover");
    let mnt = Tmpfs::mount(&dir.join("mnt"), "512k");
    // Fill it up (the tracer's own up-front check needs only an empty file).
    let filler = mnt.0.join("filler");
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=4k"])
        .arg(format!("of={}", filler.display()))
        .stderr(Stdio::null())
        .status();
    let log = dir.join("gt.log");
    let stop = dir.join("stop");
    let mut bg = common::Background::spawn(&[
        "-o",
        mnt.0.to_str().unwrap(),
        "--",
        common::bin("workload").to_str().unwrap(),
        "--loop-ms",
        "120000",
        "--stop-file",
        stop.to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
    ]);
    bg.wait_for("No space left", 90);
    fs::remove_file(&filler).unwrap();
    bg.wait_for("writing again", 60);
    fs::write(&stop, "").unwrap();
    let (code, err) = bg.finish();
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("but were retried: every row is in the files"),
        "{err}"
    );
    let (_, rows) = whole_dump(&mnt.0);
    let gt = common::parse_log(&log);
    assert_eq!(rows.len() as u64, expected_rows(&gt), "{err}");
    drop(mnt);
    fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// What to trace
// ---------------------------------------------------------------------------------------------

/// Runs the tracer, killed after `secs` (the old code attached to pid 1 and waited forever).
fn run_tracer_bounded(args: &[&str], secs: u64) -> (Option<i32>, String) {
    let child = Command::new(TRACER)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let killer = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(secs));
        // SAFETY: plain kill(2) of our child (a no-op error if it has been reaped).
        unsafe { libc::kill(pid, libc::SIGKILL) };
    });
    let out = child.wait_with_output().unwrap();
    drop(killer);
    (out.status.code(), stderr_of(&out))
}

/// A kernel thread, found without the tracer's help: kthreadd (pid 2) or one of its children.
fn a_kernel_thread() -> Option<u32> {
    let is_kthreadd = |p: u32| {
        fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "kthreadd")
    };
    if is_kthreadd(2) {
        return Some(2);
    }
    fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let ppid = status.lines().find_map(|l| l.strip_prefix("PPid:"))?.trim();
        (ppid == "2" && fs::read(format!("/proc/{pid}/cmdline")).ok()?.is_empty()).then_some(pid)
    })
}

#[test]
fn pid_1_and_kernel_threads_are_refused_before_tracing() {
    // The whole binary runs one test at a time: its races are timed against each other.
    let _serial = common::serial();
    let (code, err) = run_tracer_bounded(&["--pid", "1"], 30);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("refusing --pid 1: that is init"), "{err}");
    match a_kernel_thread() {
        Some(k) => {
            let (code, err) = run_tracer_bounded(&["--pid", &k.to_string()], 30);
            assert_eq!(code, Some(2), "{err}");
            assert!(err.contains("is a kernel thread"), "{err}");
        }
        None => eprintln!("SKIPPED the kernel-thread half: no kernel thread visible here"),
    }
}

#[test]
fn program_that_cannot_be_executed_is_refused_before_tracing() {
    // The whole binary runs one test at a time: its races are timed against each other.
    let _serial = common::serial();
    let dir = scratch("safety-noexec");
    let script = dir.join("not-executable.sh");
    fs::write(&script, "#!/bin/sh\necho ran > \"$0.ran\"\n").unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o644)).unwrap();
    let (code, err) = run_tracer_bounded(
        &[
            "-o",
            dir.join("out").to_str().unwrap(),
            "--",
            script.to_str().unwrap(),
        ],
        60,
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not executable"), "{err}");
    // Refused before anything else: no BPF (its messages), no output directory.
    assert!(!err.contains("tracing"), "{err}");
    assert!(!dir.join("out").exists());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn thread_id_given_to_pid_traces_its_process() {
    if !common::require_root("thread_id_given_to_pid_traces_its_process") {
        return;
    }
    let _serial = common::serial();
    let dir = scratch("safety-tid");
    let so = dir.join("extra_thread.so");
    let cc = Command::new("cc")
        .args(["-O2", "-shared", "-fPIC", "-pthread", "-o"])
        .arg(&so)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/safety/extra_thread.c"))
        .output()
        .expect("run cc");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let log = dir.join("gt.log");
    let go = dir.join("go");
    let tid_file = dir.join("tid");
    let out_dir = dir.join("out");
    let mut target = Command::new(common::bin("workload"))
        .args(["--wait-file", go.to_str().unwrap(), "--steps", "2", "--log"])
        .arg(&log)
        .env("LD_PRELOAD", &so)
        .env("EXTRA_THREAD_TID_FILE", &tid_file)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let tid: u32 = loop {
        if let Ok(t) = fs::read_to_string(&tid_file) {
            break t.trim().parse().unwrap();
        }
        assert!(std::time::Instant::now() < deadline, "no thread id written");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let pid = target.id();
    assert_ne!(tid, pid);
    let mut tracer =
        common::Background::spawn(&["--pid", &tid.to_string(), "-o", out_dir.to_str().unwrap()]);
    tracer.wait_for("attached to pid", 90);
    assert!(
        tracer
            .seen_line("is a thread of process")
            .contains(&format!("{tid} is a thread of process {pid}")),
    );
    assert!(
        tracer
            .seen_line("attached to pid")
            .contains(&format!("pid {pid}"))
    );
    fs::write(&go, "").unwrap();
    assert!(target.wait().unwrap().success());
    let (code, err) = tracer.finish();
    assert_eq!(code, Some(0), "{err}");
    let gt = common::parse_log(&log);
    let rows = common::rows_of(&out_dir, pid);
    assert_eq!(
        common::memory_rows(&rows, "MALLOC"),
        common::gt_rows(&gt, &["MALLOC"])
    );
    assert_eq!(
        common::memory_rows(&rows, "FREE"),
        common::gt_rows(&gt, &["FREE"])
    );
    assert!(!gt.of("MALLOC").is_empty());
    fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// A killed or frozen tracer
// ---------------------------------------------------------------------------------------------

/// Children of `pid` (from /proc, not from the tracer).
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(rd) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let p: u32 = e.file_name().to_str()?.parse().ok()?;
            let status = fs::read_to_string(format!("/proc/{p}/status")).ok()?;
            let ppid: u32 = status
                .lines()
                .find_map(|l| l.strip_prefix("PPid:"))?
                .trim()
                .parse()
                .ok()?;
            (ppid == pid).then_some(p)
        })
        .collect()
}

fn wait_until(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    false
}

/// Launches a forking workload (it forks and execs a child after `go`), freezes the tracer,
/// lets the workload go and waits until the BPF side has stopped the child at its exec (only
/// the tracer would continue it). Returns the tracer, the workload's pid and the scratch dir.
fn child_stopped_at_exec(name: &str) -> (common::Background, u32, common::Scratch) {
    let dir = scratch(name);
    let go = dir.join("go");
    let log = dir.join("gt.log");
    let mut tracer = common::Background::spawn(&[
        "-o",
        dir.join("out").to_str().unwrap(),
        "--",
        common::bin("workload").to_str().unwrap(),
        "--wait-file",
        go.to_str().unwrap(),
        "--steps",
        "1",
        "--spawn-child",
        "--log",
        log.to_str().unwrap(),
    ]);
    let pid = tracer.target_pid();
    // Released and exec'd (not still at the tracer's gate), now waiting for `go`.
    let waiting = wait_until(60, || {
        fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "workload")
            && common::process_state(pid) == Some('S')
    });
    assert!(waiting, "the workload never started");
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(tracer.child.id() as i32, libc::SIGSTOP) };
    fs::write(&go, "").unwrap();
    let stopped = wait_until(30, || {
        children_of(pid)
            .iter()
            .any(|c| common::process_state(*c) == Some('T'))
    });
    assert!(stopped, "the workload's child was never stopped at exec");
    (tracer, pid, dir)
}

/// The workload and its child ran to the end (the child's own log has its summary).
fn assert_workload_finished(pid: u32, dir: &Path) {
    let done = wait_until(60, || {
        matches!(common::process_state(pid), None | Some('Z'))
    });
    let kids: Vec<(u32, Option<char>)> = children_of(pid)
        .into_iter()
        .map(|c| (c, common::process_state(c)))
        .collect();
    assert!(
        done,
        "workload {pid} still there ({:?}); its children: {kids:?}",
        common::process_state(pid)
    );
    let child_log = fs::read_to_string(dir.join("gt.log.child")).unwrap_or_default();
    assert!(
        child_log.contains("SUMMARY"),
        "the child never finished: {child_log}"
    );
}

#[test]
fn sigkilled_tracer_leaves_no_process_stopped() {
    if !common::require_root("sigkilled_tracer_leaves_no_process_stopped") {
        return;
    }
    let _serial = common::serial();
    let (mut tracer, pid, dir) = child_stopped_at_exec("safety-kill9");
    tracer.child.kill().unwrap();
    let _ = tracer.child.wait();
    assert_workload_finished(pid, &dir);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn frozen_tracer_does_not_freeze_the_job() {
    if !common::require_root("frozen_tracer_does_not_freeze_the_job") {
        return;
    }
    let _serial = common::serial();
    let (tracer, pid, dir) = child_stopped_at_exec("safety-frozen");
    assert_workload_finished(pid, &dir);
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(tracer.child.id() as i32, libc::SIGCONT) };
    let (code, err) = tracer.finish();
    assert_eq!(code, Some(0), "{err}");
    fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Bounded memory offline
// ---------------------------------------------------------------------------------------------

/// Runs `analyze` on `input`; returns its exit code, stderr and peak RSS in KiB (wait4's
/// rusage of that one child, not the tracer's own account).
#[allow(clippy::zombie_processes)] // reaped with wait4, which std does not know about
fn analyze_peak_rss(input: &Path, out: &Path) -> (Option<i32>, String, i64) {
    let mut child = Command::new(TRACER)
        .arg("analyze")
        .arg(format!("--input-path={}", input.display()))
        .arg("-o")
        .arg(out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    let mut status = 0;
    // SAFETY: zeroed rusage filled by wait4 for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    assert_eq!(r, pid);
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    (code, stderr, ru.ru_maxrss)
}

#[test]
fn huge_lines_are_refused_with_bounded_memory() {
    // The whole binary runs one test at a time: its races are timed against each other.
    let _serial = common::serial();
    let dir = scratch("safety-huge");
    // 8 GiB of zeros (sparse): no header, no line end.
    let zeros = dir.join("zeros.csv");
    fs::File::create(&zeros).unwrap().set_len(8 << 30).unwrap();
    let (code, err, rss_kib) = analyze_peak_rss(&zeros, &dir.join("out"));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no header line"), "{err}");
    assert!(rss_kib < 64 << 10, "peak RSS {rss_kib} KiB");
    // A good header, one good row, then a 2 GiB line.
    let long = dir.join("long.csv");
    fs::write(
        &long,
        format!(
            "{CSV_HEADER}\n0,MALLOC,HAL,N/A,10,77,78,0,0x0000124000000000,\"{{allocation_id:1,addr:0x0000124000000000,size:4096}}\",,\n"
        ),
    )
    .unwrap();
    let f = fs::OpenOptions::new().append(true).open(&long).unwrap();
    f.set_len(f.metadata().unwrap().len() + (2 << 30)).unwrap();
    let (code, err, rss_kib) = analyze_peak_rss(&long, &dir.join("out"));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(":3:") || err.contains("line 3"), "{err}");
    assert!(err.contains("longer than 16 MiB"), "{err}");
    assert!(rss_kib < 96 << 10, "peak RSS {rss_kib} KiB");
    eprintln!("peak RSS on the 2 GiB line: {rss_kib} KiB");
    fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// sudo
// ---------------------------------------------------------------------------------------------

/// Launches the workload as root "under sudo for nobody" (SUDO_UID/SUDO_GID as sudo sets them);
/// returns the tracer's exit code and stderr.
fn traced_under_sudo(home: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let mut cmd = Command::new(TRACER);
    cmd.args(extra)
        .arg("-o")
        .arg(home.join("out"))
        .arg("--")
        .arg(common::bin("workload"))
        .args(["--steps", "1", "--log"])
        .arg(home.join("gt.log"))
        .env("SUDO_UID", NOBODY.to_string())
        .env("SUDO_GID", NOBODY.to_string())
        .env("SUDO_USER", "nobody")
        .stdout(Stdio::null());
    let out = cmd.output().unwrap();
    (out.status.code(), stderr_of(&out))
}

/// Every directory and file under `dir` (itself included): (path, uid, gid, mode).
fn owners(dir: &Path) -> Vec<(PathBuf, u32, u32, u32)> {
    let m = fs::symlink_metadata(dir).unwrap();
    let mut v = vec![(dir.to_path_buf(), m.uid(), m.gid(), m.mode() & 0o777)];
    if m.is_dir() {
        for e in fs::read_dir(dir).unwrap() {
            v.extend(owners(&e.unwrap().path()));
        }
    }
    v
}

#[test]
fn under_sudo_the_program_runs_as_the_user_and_the_results_are_theirs() {
    if !common::require_root("under_sudo_the_program_runs_as_the_user_and_the_results_are_theirs") {
        return;
    }
    let _serial = common::serial();
    let dir = open_scratch("safety-sudo");
    let home = dir.join("home");
    fs::create_dir(&home).unwrap();
    chown(&home, NOBODY);
    let (code, err) = traced_under_sudo(&home, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("running the program as nobody (uid 65534, gid 65534"),
        "{err}"
    );
    // The workload created its log: the kernel made it the user's.
    let log = fs::metadata(home.join("gt.log")).unwrap();
    assert_eq!((log.uid(), log.gid()), (NOBODY, NOBODY));
    let gt = common::parse_log(&home.join("gt.log"));
    assert!(!gt.of("MALLOC").is_empty());
    let out = owners(&home.join("out"));
    assert!(out.len() >= 5, "{out:?}"); // out, process dir, config.json, device_0, dump, csv
    for (p, uid, gid, mode) in &out {
        assert_eq!((*uid, *gid), (NOBODY, NOBODY), "{}", p.display());
        let want = if fs::symlink_metadata(p).unwrap().is_dir() {
            0o750
        } else {
            0o640
        };
        assert_eq!(*mode, want, "{}", p.display());
    }
    // The user can remove what was written for them.
    let rm = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "rm",
            "-r",
        ])
        .arg(home.join("out"))
        .status()
        .unwrap();
    assert!(rm.success());
    // --as-root keeps root.
    fs::remove_file(home.join("gt.log")).unwrap();
    let (code, err) = traced_under_sudo(&home, &["--as-root"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(fs::metadata(home.join("gt.log")).unwrap().uid(), 0);
    assert!(owners(&home.join("out")).iter().all(|o| o.1 == 0));
    fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Rotation
// ---------------------------------------------------------------------------------------------

#[test]
fn long_run_rotates_through_more_files_than_it_keeps() {
    if !common::require_root("long_run_rotates_through_more_files_than_it_keeps") {
        return;
    }
    let _serial = common::serial();
    let dir = scratch("safety-rotate");
    let out_dir = dir.join("out");
    let log = dir.join("gt.log");
    let out = common::run_tracer(&[
        "-o",
        out_dir.to_str().unwrap(),
        "--max-file-mib",
        "1",
        "--max-files",
        "3",
        "--",
        common::bin("workload").to_str().unwrap(),
        "--handoff",
        "20000",
        "--log",
        log.to_str().unwrap(),
    ]);
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let gt = common::parse_log(&log);
    let total = expected_rows(&gt);
    // ~170 bytes a row: some 6 MiB were written, so at least 5 files were started.
    assert!(total > 30_000, "{total}");
    let files = find_files(&out_dir, "memscope_dump_");
    assert_eq!(files.len(), 3, "{files:?}");
    let mut ids = Vec::new();
    for f in &files {
        let size = fs::metadata(f).unwrap().len();
        assert!(
            size <= (1 << 20) + (256 << 10) + 4096,
            "{} is {size} bytes",
            f.display()
        );
        let text = fs::read_to_string(f).unwrap();
        assert!(text.ends_with('\n'));
        let rows = common::parse_dump(f); // header and 12 fields checked
        ids.extend(rows.iter().map(|r| r.id));
        let a = analyze(f, &dir.join("analysis"), None);
        assert_eq!(
            a.status.code(),
            Some(0),
            "{}: {}",
            f.display(),
            stderr_of(&a)
        );
    }
    // The kept files hold the newest rows, without a gap, up to the very last one.
    ids.sort();
    assert_eq!(
        *ids.last().unwrap() + 1,
        total,
        "last id vs the workload's rows"
    );
    assert!(
        ids.windows(2).all(|w| w[1] == w[0] + 1),
        "a gap in the kept rows"
    );
    assert!(ids[0] > 0, "the oldest files were deleted");
    // The online analysis saw every row, rotated out or not.
    assert!(
        err.contains("leak report: no leaked tensor and no leaked driver memory"),
        "{err}"
    );
    fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// mstx strings not yet resident
// ---------------------------------------------------------------------------------------------

#[test]
fn mstx_strings_in_untouched_pages_are_read() {
    if !common::require_root("mstx_strings_in_untouched_pages_are_read") {
        return;
    }
    let _serial = common::serial();
    let dir = scratch("safety-untouched");
    let fixtures = common::fixtures();
    let prog = dir.join("untouched_mark");
    let cc = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&prog)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/safety/untouched_mark.c"))
        .arg(format!(
            "-I{}",
            common::repo_root().join("tests/fixtures/include").display()
        ))
        .arg(format!("-L{}", fixtures.join("lib").display()))
        .arg(format!("-Wl,-rpath,{}", fixtures.join("lib").display()))
        .arg("-lms_tools_ext")
        .output()
        .expect("run cc");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out_dir = dir.join("out");
    let out = Command::new(TRACER)
        .env_remove("SUDO_UID")
        .arg("-v")
        .arg("-o")
        .arg(&out_dir)
        .arg("--")
        .arg(&prog)
        .output()
        .unwrap();
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    // What the program itself passed (it printed the strings after the calls).
    let said: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(said, ["step start", "untouched mark"]);
    let rows: Vec<common::DumpRow> = find_files(&out_dir, "memscope_dump_")
        .iter()
        .flat_map(|f| common::parse_dump(f))
        .collect();
    let names = |t: &str| -> Vec<String> {
        rows.iter()
            .filter(|r| r.event == "MSTX" && r.event_type == t)
            .map(|r| r.name.clone())
            .collect()
    };
    assert_eq!(names("Range_start"), ["step start"], "{err}");
    assert_eq!(names("Mark"), ["untouched mark"], "{err}");
    assert!(!err.contains("could not be read"), "{err}");
    // The BPF side really could not read them (the case this test is about).
    assert!(
        err.contains("2 mstx message(s) in pages the target had not touched yet"),
        "{err}"
    );
    fs::remove_dir_all(&dir).unwrap();
}
