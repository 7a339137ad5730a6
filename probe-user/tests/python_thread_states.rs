//! End-to-end: which Python thread state is a thread's. CPython records in a thread state the
//! thread that *made* it, not the one that runs it, so a thread can be named by states that are
//! not its own: one made on it for another thread (tests/fixtures/python/py_stray_thread_state.py,
//! `PyThreadState_New` on the main thread, deleted later), or a sub-interpreter's state made by
//! the main thread and run by a second thread (py_subinterp.py `--cross-thread`, 3.11 and 3.12
//! `_xxsubinterpreters`). Every MALLOC and FREE row's Python stack must still be the calling
//! thread's own, as the program logged it (`traceback.extract_stack()` on the call's line), in
//! launch and `--pid` modes, on 3.11, 3.12 and 3.13 where installed.

mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use common::*;

fn fixture(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures/python").join(name)
}

fn pythons() -> Vec<(String, PathBuf)> {
    let found = interpreters_of(&[11, 12, 13]);
    assert!(
        found.iter().any(|(v, _)| v == "3.11"),
        "no working python3.11 found (PATH or /root/.pyenv/versions)"
    );
    found
}

/// (event, address, stack text) of the program's HAL calls, in its log's order.
fn logged(text: &str) -> Vec<(String, u64, String)> {
    text.lines()
        .filter_map(|line| {
            let event = match line.split(' ').next() {
                Some("ALLOC") => "MALLOC",
                Some("FREE") => "FREE",
                _ => return None,
            };
            let json = line.split_once(" stack=").expect("stack field").1;
            let frames: String = json
                .trim_start_matches("[[")
                .trim_end_matches("]]")
                .split("],[")
                .map(|f| {
                    let parts: Vec<&str> = f.split(',').collect();
                    assert_eq!(parts.len(), 3, "frame {f:?}");
                    format!(
                        "{}({}): {}\n",
                        parts[0].trim_matches('"'),
                        parts[1],
                        parts[2].trim_matches('"')
                    )
                })
                .collect();
            Some((event.to_string(), hex(log_fields(line)["addr"]), frames))
        })
        .collect()
}

/// (event, address, `Call Stack(Python)`) of `pid`'s MALLOC and FREE rows, in order.
fn traced(out_dir: &Path, pid: u32) -> Vec<(String, u64, String)> {
    let pdir = process_dir(out_dir, pid).expect("process directory");
    let dump = std::fs::read_to_string(&find_files(&pdir, "memscope_dump_")[0]).unwrap();
    parse_dump_records(&dump)
        .into_iter()
        .filter(|r| r[1] == "MALLOC" || r[1] == "FREE")
        .map(|r| (r[1].clone(), hex(&r[8]), r[10].clone()))
        .collect()
}

/// Runs `script args` under the tracer (launch mode); returns its log and its rows.
fn launch(python: &Path, dir: &Path, script: &Path, args: &[&str]) -> (String, u32, String) {
    let log = dir.join("gt.log");
    let out_dir = dir.join("out");
    let mut all = vec![
        "-o",
        out_dir.to_str().unwrap(),
        "--call-stack=python",
        "--",
        python.to_str().unwrap(),
        script.to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    let out = run_tracer(&all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&log).unwrap();
    let pid: u32 = log_lines(&text, "SUMMARY")[0]["pid"].parse().unwrap();
    (text, pid, out_dir.display().to_string())
}

/// `--pid`: the script started on its own (`--go FILE`), the tracer attached before its
/// first HAL call.
fn attach(python: &Path, dir: &Path, script: &Path, args: &[&str]) -> (String, u32, String) {
    let log = dir.join("gt.log");
    let go = dir.join("go");
    let out_dir = dir.join("out");
    let mut target = Command::new(python)
        .arg(script)
        .args(["--log", log.to_str().unwrap(), "--go", go.to_str().unwrap()])
        .args(args)
        .spawn()
        .expect("start the Python target");
    let pid = target.id();
    wait_for_text(&log, "READY", 30);
    let tracer = attach_python_tracer(&out_dir, pid);
    std::fs::write(&go, b"").unwrap();
    assert!(target.wait().unwrap().success());
    let (code, stderr) = tracer.finish();
    assert_eq!(code, Some(0), "{stderr}");
    let text = std::fs::read_to_string(&log).unwrap();
    (text, pid, out_dir.display().to_string())
}

fn assert_own_stacks(what: &str, text: &str, pid: u32, out_dir: &str, calls: usize) {
    let want = logged(text);
    assert_eq!(want.len(), calls, "{what}: calls in\n{text}");
    let got = traced(Path::new(out_dir), pid);
    assert_eq!(got.len(), want.len(), "{what}: rows {got:#?}");
    for (g, w) in got.iter().zip(&want) {
        assert_eq!((&g.0, g.1), (&w.0, w.1), "{what}: row order");
        assert_eq!(g.2, w.2, "{what}: Python stack of {} {:#x}", w.0, w.1);
    }
}

#[test]
fn a_thread_state_made_for_another_thread_does_not_take_the_threads_stacks() {
    let test = "a_thread_state_made_for_another_thread_does_not_take_the_threads_stacks";
    if !require_root(test) {
        return;
    }
    let _serial = serial();
    let script = fixture("py_stray_thread_state.py");
    let lib = fixtures().join("lib");
    let args = ["--lib-dir", lib.to_str().unwrap()];
    for (version, python) in pythons() {
        for mode in ["launch", "attach"] {
            let dir = scratch(&format!("python_stray_state_{version}_{mode}"));
            let (text, pid, out_dir) = if mode == "launch" {
                launch(&python, &dir, &script, &args)
            } else {
                attach(&python, &dir, &script, &args)
            };
            // 4 allocations (2 while the stray state exists) and their frees.
            assert_own_stacks(&format!("{version}, {mode}"), &text, pid, &out_dir, 8);
            eprintln!("python {version}, {mode}: every stack is the main thread's own");
        }
    }
}

#[test]
fn a_sub_interpreter_run_from_another_thread_has_that_threads_frames() {
    let test = "a_sub_interpreter_run_from_another_thread_has_that_threads_frames";
    if !require_root(test) {
        return;
    }
    let _serial = serial();
    let script = fixture("py_subinterp.py");
    let lib = fixtures().join("lib");
    for (version, python) in pythons() {
        let dir = scratch(&format!("python_cross_thread_{version}"));
        let args = ["--lib-dir", lib.to_str().unwrap(), "--cross-thread"];
        let (text, pid, out_dir) = launch(&python, &dir, &script, &args);
        // The second thread's calls ran in the sub-interpreter the main thread made.
        let in_other: Vec<_> = log_lines(&text, "ALLOC")
            .into_iter()
            .filter(|f| f["tid"] != pid.to_string() && f["interp"] != "0")
            .collect();
        assert_eq!(in_other.len(), 2, "{version}: {text}");
        assert_own_stacks(&version, &text, pid, &out_dir, 12);
        eprintln!("python {version}: the second thread's sub-interpreter frames are its own");
    }
}
