//! End-to-end: probes live only in the traced processes. A process that is not traced keeps
//! its code as it is on disk (no breakpoint, so it pays nothing) and produces no events, while
//! every process of the traced tree (forked without exec, threads, exec) is still traced from
//! its first call. Expectations come from the workloads' own logs and from the bytes of the
//! library file, never from the tracer.

mod common;

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use common::*;

/// The library the workloads allocate through, as the fixtures build it.
fn hal_library() -> PathBuf {
    fixtures().join("lib/libascend_hal.so")
}

/// The bytes of `symbol`'s code in process `pid`'s mapping of `library` and in the file.
fn code_in_memory_and_on_disk(pid: u32, library: &Path, symbol: &str) -> (Vec<u8>, Vec<u8>) {
    let obj = memscope_symbols::ElfObject::open(library).unwrap();
    let func = obj.function(symbol).unwrap().clone();
    let file = fs::read(library).unwrap();
    let on_disk = file[func.file_offset as usize..(func.file_offset + func.size) as usize].to_vec();
    let wanted = fs::canonicalize(library).unwrap();
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || fs::canonicalize(f[5]).ok().as_ref() != Some(&wanted) {
            continue;
        }
        let (start, end) = f[0].split_once('-').unwrap();
        let (start, end) = (hex(start), hex(end));
        let map_off = hex(f[2]);
        if func.file_offset < map_off || func.file_offset + func.size > map_off + (end - start) {
            continue;
        }
        let addr = start + (func.file_offset - map_off);
        let mut in_memory = vec![0u8; func.size as usize];
        use std::os::unix::fs::FileExt;
        fs::File::open(format!("/proc/{pid}/mem"))
            .unwrap()
            .read_exact_at(&mut in_memory, addr)
            .unwrap();
        return (in_memory, on_disk);
    }
    panic!(
        "{symbol} of {} not mapped in pid {pid}:\n{maps}",
        library.display()
    );
}

/// The workload's arguments for an alloc/free loop that logs to `log` and ends once `stop`
/// exists (or after two minutes).
fn loop_args<'a>(log: &'a Path, stop: &'a Path) -> [&'a std::ffi::OsStr; 6] {
    [
        "--loop-ms".as_ref(),
        "120000".as_ref(),
        "--stop-file".as_ref(),
        stop.as_os_str(),
        "--log".as_ref(),
        log.as_os_str(),
    ]
}

/// That loop, untraced.
fn spawn_loop(log: &Path, stop: &Path) -> std::process::Child {
    Command::new(bin("workload"))
        .args(loop_args(log, stop))
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// Runs a traced workload next to an untraced one on the same library, with `scope` in the
/// tracer's `MEMSCOPE_BPF_SCOPE`; returns whether halMemAlloc's code differs from the file in
/// (the traced process, the untraced one), and checks the untraced one got no output.
fn breakpoints_with_scope(name: &str, scope: Option<&str>) -> (bool, bool) {
    let dir = scratch(name);
    let out_dir = dir.join("out");
    let stop = dir.join("stop");
    let neighbour_log = dir.join("neighbour.log");
    let mut neighbour = spawn_loop(&neighbour_log, &stop);
    wait_for_text(&neighbour_log, "FREE", 30);
    let log = dir.join("gt.log");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memscope-bpf"));
    cmd.args(["-o", out_dir.to_str().unwrap(), "--"])
        .arg(bin("workload"))
        .args(loop_args(&log, &stop))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    match scope {
        Some(s) => cmd.env("MEMSCOPE_BPF_SCOPE", s),
        None => cmd.env_remove("MEMSCOPE_BPF_SCOPE"),
    };
    // No breakpoints left behind for the next test's untraced process (system scope puts
    // them in every process that maps the library until the teardown is done).
    cmd.env("MEMSCOPE_BPF_DETACH", "foreground");
    let tracer = cmd.spawn().unwrap();
    // The traced loop runs (its frees are logged) once its probes are in place.
    wait_for_text(&log, "FREE", 90);
    let target = parse_log_pid(&log);
    let (traced_mem, traced_disk) =
        code_in_memory_and_on_disk(target, &hal_library(), "halMemAlloc");
    let (other_mem, other_disk) =
        code_in_memory_and_on_disk(neighbour.id(), &hal_library(), "halMemAlloc");
    fs::write(&stop, b"").unwrap();
    let out = tracer.wait_with_output().unwrap();
    assert!(neighbour.wait().unwrap().success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Whatever the scope, the untraced process's calls are not events.
    assert!(
        process_dir(&out_dir, neighbour.id()).is_none(),
        "the untraced process got an output directory"
    );
    // And the traced one's are all there.
    let gt = parse_log(&log);
    let rows = rows_of(&out_dir, gt.pid);
    assert_eq!(memory_rows(&rows, "MALLOC"), gt_rows(&gt, &["MALLOC"]));
    (traced_mem != traced_disk, other_mem != other_disk)
}

/// The pid the workload wrote in its log (`pid=N` of its first record).
fn parse_log_pid(log: &Path) -> u32 {
    let text = fs::read_to_string(log).unwrap();
    text.lines()
        .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("pid=")))
        .and_then(|p| p.parse().ok())
        .expect("pid in the workload's log")
}

#[test]
fn an_untraced_process_on_the_same_library_keeps_its_code_and_gives_no_events() {
    if !require_root("an_untraced_process_on_the_same_library_keeps_its_code_and_gives_no_events") {
        return;
    }
    let _serial = serial();
    let (traced, untraced) = breakpoints_with_scope("scope-traced", None);
    assert!(
        traced,
        "the traced process has no breakpoint in halMemAlloc"
    );
    assert!(
        !untraced,
        "the untraced process has a breakpoint in halMemAlloc"
    );
    // The check can see a breakpoint in the neighbour: system-wide probes put one there.
    let (traced, untraced) = breakpoints_with_scope("scope-system", Some("system"));
    assert!(
        traced && untraced,
        "system-wide probes: ({traced}, {untraced})"
    );
}

#[test]
fn a_child_forked_without_exec_is_traced_from_its_first_call() {
    if !require_root("a_child_forked_without_exec_is_traced_from_its_first_call") {
        return;
    }
    let _serial = serial();
    let dir = scratch("fork-child");
    let log = dir.join("gt.log");
    let out_dir = dir.join("out");
    let out = run_tracer(&[
        "-o",
        out_dir.to_str().unwrap(),
        "--",
        bin("workload").to_str().unwrap(),
        "--threads",
        "2",
        "--steps",
        "1",
        "--fork-child",
        "--log",
        log.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let parent = parse_log(&log);
    let child = parse_log(&dir.join("gt.log.fork"));
    assert_ne!(parent.pid, child.pid);
    // The child calls halMemAlloc from threads right after fork: every call is a row.
    for gt in [&parent, &child] {
        let rows = rows_of(&out_dir, gt.pid);
        assert!(!gt.of("MALLOC").is_empty());
        assert_eq!(memory_rows(&rows, "MALLOC"), gt_rows(gt, &["MALLOC"]));
        assert_eq!(memory_rows(&rows, "FREE"), gt_rows(gt, &["FREE"]));
        assert_eq!(leak_rows(&out_dir, gt.pid), gt_leaks(gt));
    }
}

#[test]
fn attach_mode_with_system_wide_probes_traces_a_new_child_from_its_first_call() {
    if !require_root("attach_mode_with_system_wide_probes_traces_a_new_child_from_its_first_call") {
        return;
    }
    let _serial = serial();
    let dir = scratch("attach-system");
    let log = dir.join("gt.log");
    let go = dir.join("go");
    let out_dir = dir.join("out");
    let mut target = Command::new(bin("workload"))
        .args([
            "--wait-file",
            go.to_str().unwrap(),
            "--steps",
            "1",
            "--spawn-child",
        ])
        .args(["--log", log.to_str().unwrap()])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut tracer = Command::new(env!("CARGO_BIN_EXE_memscope-bpf"))
        .args([
            "--pid",
            &target.id().to_string(),
            "-o",
            out_dir.to_str().unwrap(),
        ])
        .env("MEMSCOPE_BPF_SCOPE", "system")
        // System-wide breakpoints must be gone when it exits: the next test's untraced
        // process maps the same library.
        .env("MEMSCOPE_BPF_DETACH", "foreground")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // "attached" is printed once the probes are in place.
    let stderr = tracer.stderr.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stderr));
    let mut seen = String::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("attached to pid") {
            break;
        }
    }
    assert!(seen.contains("attached to pid"), "{seen}");
    fs::write(&go, b"").unwrap();
    assert!(target.wait().unwrap().success());
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(
        tracer.wait().unwrap().success(),
        "{seen}{}",
        rest.join("\n")
    );
    let parent = parse_log(&log);
    let child = parse_log(&dir.join("gt.log.child"));
    for gt in [&parent, &child] {
        let rows = rows_of(&out_dir, gt.pid);
        assert_eq!(memory_rows(&rows, "MALLOC"), gt_rows(gt, &["MALLOC"]));
        assert_eq!(leak_rows(&out_dir, gt.pid), gt_leaks(gt));
    }
}

#[test]
fn cookie_bits_above_the_probe_id_leave_the_probe_unchanged_and_reach_user_space() {
    use memscope_bpf::{
        events::decode,
        trace::bpf::{Bpf, Scope},
        trace::probes::{PROBES, ProbeId},
        trace::tracefs,
    };
    if !require_root(
        "cookie_bits_above_the_probe_id_leave_the_probe_unchanged_and_reach_user_space",
    ) {
        return;
    }
    let _serial = serial();
    let dir = scratch("cookie");
    let log = dir.join("gt.log");
    let go = dir.join("go");
    let mut target = Command::new(bin("workload"))
        .args([
            "--wait-file",
            go.to_str().unwrap(),
            "--steps",
            "1",
            "--threads",
            "2",
        ])
        .args(["--log", log.to_str().unwrap()])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let offsets = tracefs::read_offsets(tracefs::ensure_mounted().unwrap()).unwrap();
    let (mut bpf, mut ring) = Bpf::load(&offsets, 4 << 20).unwrap();
    for p in &PROBES {
        bpf.set_spec(p.id as u16, p.spec).unwrap();
    }
    bpf.trace_process(target.id()).unwrap();
    let entry = |lib: &str, symbol: &str| {
        let path = fixtures().join("lib").join(lib);
        let obj = memscope_symbols::ElfObject::open(&path).unwrap();
        (path, obj.function(symbol).unwrap().file_offset)
    };
    // Function indexes above the probe id, as a caller with one id for many functions does.
    let (hal, alloc) = entry("libascend_hal.so", "halMemAlloc");
    let (_, free) = entry("libascend_hal.so", "halMemFree");
    let hal_points = [
        (alloc, (7 << 16) | ProbeId::HalMemAlloc as u64),
        (free, (9 << 16) | ProbeId::HalMemFree as u64),
    ];
    bpf.attach_many(&hal, &hal_points, true, Scope::Traced)
        .unwrap();
    let (mstx, mark) = entry("libms_tools_ext.so", "mstxMarkA");
    let mark_point = [(mark, (5 << 16) | ProbeId::MstxMarkA as u64)];
    bpf.attach_many(&mstx, &mark_point, false, Scope::Traced)
        .unwrap();
    fs::write(&go, b"").unwrap();
    assert!(target.wait().unwrap().success());
    assert!(bpf.flush_call_batches());
    let (mut allocs, mut frees, mut marks) = (0, 0, Vec::new());
    while let Some(item) = ring.next() {
        let calls: Vec<_> = match decode::batch_calls(&item) {
            Some(calls) => calls.collect(),
            None => decode::raw_from_bytes(&item).into_iter().collect(),
        };
        for raw in calls.iter().filter(|r| r.kind == probe_common::kind::CALL) {
            match raw.probe {
                p if p == ProbeId::HalMemAlloc as u16 => allocs += 1,
                p if p == ProbeId::HalMemFree as u16 => frees += 1,
                p if p == ProbeId::MstxMarkA as u16 => marks.push(raw.cpu),
                other => panic!("event of probe {other}: the cookie's upper bits leaked in"),
            }
        }
    }
    let gt = parse_log(&log);
    assert_eq!(allocs, gt.of("MALLOC").len());
    assert_eq!(frees, gt.of("FREE").len());
    // A mark is sent whole: the bits above the id come with it.
    assert!(!gt.marks.is_empty());
    assert_eq!(marks, vec![5; gt.marks.len()]);
}

/// Attaches with `--pid` (and `scope` in `MEMSCOPE_BPF_SCOPE`) to a running workload next to
/// an untraced one, stops the tracer with SIGINT once it traced some calls, and reads
/// halMemAlloc's code in both the moment the tracer has exited. Returns whether each still
/// differs from the file (a breakpoint left behind) in (the formerly traced, the untraced).
fn breakpoints_right_after_detach(name: &str, scope: Option<&str>) -> (bool, bool) {
    let dir = scratch(name);
    let out_dir = dir.join("out");
    let stop = dir.join("stop");
    let (log, neighbour_log) = (dir.join("gt.log"), dir.join("neighbour.log"));
    let mut target = spawn_loop(&log, &stop);
    let mut neighbour = spawn_loop(&neighbour_log, &stop);
    wait_for_text(&log, "FREE", 30);
    wait_for_text(&neighbour_log, "FREE", 30);
    let stderr_path = dir.join("tracer.stderr");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memscope-bpf"));
    cmd.args([
        "--pid",
        &target.id().to_string(),
        "-o",
        out_dir.to_str().unwrap(),
    ])
    .env_remove("MEMSCOPE_BPF_DETACH")
    .stdout(Stdio::null())
    .stderr(fs::File::create(&stderr_path).unwrap());
    match scope {
        Some(s) => cmd.env("MEMSCOPE_BPF_SCOPE", s),
        None => cmd.env_remove("MEMSCOPE_BPF_SCOPE"),
    };
    let mut tracer = cmd.spawn().unwrap();
    wait_for_text(&stderr_path, "attached to pid", 90);
    let (mem, disk) = code_in_memory_and_on_disk(target.id(), &hal_library(), "halMemAlloc");
    assert_ne!(
        mem, disk,
        "no breakpoint in the traced process while attached"
    );
    // Some calls traced: the loop frees a block every few milliseconds.
    std::thread::sleep(std::time::Duration::from_millis(300));
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
    let status = tracer.wait().unwrap();
    let (traced_mem, traced_disk) =
        code_in_memory_and_on_disk(target.id(), &hal_library(), "halMemAlloc");
    let (other_mem, other_disk) =
        code_in_memory_and_on_disk(neighbour.id(), &hal_library(), "halMemAlloc");
    fs::write(&stop, b"").unwrap();
    assert!(target.wait().unwrap().success());
    assert!(neighbour.wait().unwrap().success());
    let stderr = fs::read_to_string(&stderr_path).unwrap();
    // Ended by SIGINT: 128 + 2.
    assert_eq!(status.code(), Some(130), "{stderr}");
    // What it traced is real: each allocation row is one the workload logged.
    let gt = parse_log(&log);
    let rows = memory_rows(&rows_of(&out_dir, gt.pid), "MALLOC");
    let logged = gt_rows(&gt, &["MALLOC"]);
    assert!(!rows.is_empty(), "no allocation traced: {stderr}");
    assert!(
        rows.iter().all(|r| logged.contains(r)),
        "rows not in the log"
    );
    assert!(process_dir(&out_dir, neighbour.id()).is_none());
    (traced_mem != traced_disk, other_mem != other_disk)
}

#[test]
fn no_breakpoint_outlives_the_tracer() {
    if !require_root("no_breakpoint_outlives_the_tracer") {
        return;
    }
    let _serial = serial();
    // Probes scoped to the traced process: its code is back as on disk when the tracer exits.
    let (traced, untraced) = breakpoints_right_after_detach("detach-traced", None);
    assert_eq!(
        (traced, untraced),
        (false, false),
        "breakpoints left after the tracer exited (traced, untraced)"
    );
    // System-wide probes were in the neighbour too; they are gone as well.
    let (traced, untraced) = breakpoints_right_after_detach("detach-system", Some("system"));
    assert_eq!(
        (traced, untraced),
        (false, false),
        "system-wide: breakpoints left after the tracer exited (traced, untraced)"
    );
}
