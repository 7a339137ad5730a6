//! End-to-end: Python stacks whose code objects die right after the call
//! (tests/fixtures/python/py_short_lived.py: a lambda, a function deleted after its call and
//! `exec`'d code, all made from source at run time, and the script's own top-level code, which
//! the interpreter frees when the script ends; after each one the program fills the freed
//! memory with new code objects). Every frame of every allocation must be the program's own
//! (`traceback.extract_stack()` on the allocation's line): BPF sends each code object at its
//! first sight, so none is read after it is gone. Launch and `--pid` modes, on 3.11, 3.12 and
//! 3.13 where installed, with the process finalizing normally and leaving with `os._exit`
//! right after its last allocation.

mod common;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use common::*;

fn script() -> PathBuf {
    repo_root().join("tests/fixtures/python/py_short_lived.py")
}

/// The script's arguments after the interpreter.
fn script_args(log: &Path, exit_now: bool) -> Vec<String> {
    let mut args = vec![
        script().display().to_string(),
        "--lib-dir".into(),
        fixtures().join("lib").display().to_string(),
        "--log".into(),
        log.display().to_string(),
    ];
    if exit_now {
        args.push("--exit-now".into());
    }
    args
}

/// Address -> the program's own stack of each allocation, as msMemScope text.
fn logged(text: &str) -> BTreeMap<u64, String> {
    log_lines(text, "ALLOC")
        .iter()
        .map(|f| (hex(f["addr"]), f["stack"]))
        .map(|(addr, json)| {
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
            (addr, frames)
        })
        .collect()
}

/// Address -> `Call Stack(Python)` of each MALLOC row of `pid`.
fn traced(out_dir: &Path, pid: u32) -> BTreeMap<u64, String> {
    let pdir = process_dir(out_dir, pid).expect("process directory");
    let dump = std::fs::read_to_string(&find_files(&pdir, "memscope_dump_")[0]).unwrap();
    parse_dump_records(&dump)
        .into_iter()
        .filter(|r| r[1] == "MALLOC")
        .map(|r| (hex(&r[8]), r[10].clone()))
        .collect()
}

fn launch(python: &Path, dir: &Path, exit_now: bool) -> (String, BTreeMap<u64, String>) {
    let log = dir.join("gt.log");
    let out_dir = dir.join("out");
    let mut args = vec![
        "-o".to_string(),
        out_dir.display().to_string(),
        "--call-stack=python".into(),
        "--".into(),
        python.display().to_string(),
    ];
    args.extend(script_args(&log, exit_now));
    let out = run_tracer(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&log).unwrap();
    let pid: u32 = log_lines(&text, "SUMMARY")[0]["pid"].parse().unwrap();
    let rows = traced(&out_dir, pid);
    (text, rows)
}

/// `--pid`: the script started on its own, the tracer attached before its first allocation.
/// Nothing holds the target: it finalizes (or leaves) at once after its last allocation.
fn attach(python: &Path, dir: &Path, exit_now: bool) -> (String, BTreeMap<u64, String>) {
    let log = dir.join("gt.log");
    let go = dir.join("go");
    let out_dir = dir.join("out");
    let mut target = Command::new(python)
        .args(script_args(&log, exit_now))
        .args(["--go", go.to_str().unwrap()])
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
    (text, traced(&out_dir, pid))
}

#[test]
fn frames_of_code_objects_freed_right_after_the_call_are_the_programs_own() {
    let test = "frames_of_code_objects_freed_right_after_the_call_are_the_programs_own";
    if !require_root(test) {
        return;
    }
    let _serial = serial();
    let pythons = interpreters_of(&[11, 12, 13]);
    assert!(
        pythons.iter().any(|(v, _)| v == "3.11"),
        "no working python3.11 found (PATH or /root/.pyenv/versions)"
    );
    for (version, python) in pythons {
        for (mode, exit_now) in [
            ("launch", false),
            ("launch", true),
            ("attach", false),
            ("attach", true),
        ] {
            let what = format!(
                "{version}, {mode}{}",
                if exit_now { ", os._exit" } else { "" }
            );
            let dir = scratch(&format!(
                "python_short_lived_{version}_{mode}_{}",
                exit_now as u8
            ));
            let (text, rows) = if mode == "launch" {
                launch(&python, &dir, exit_now)
            } else {
                attach(&python, &dir, exit_now)
            };
            let want = logged(&text);
            // The lambda, the deleted function, the exec'd code and the module's own line.
            let all: String = want.values().cloned().collect();
            for needle in [
                "<short-lived-lambda>(1): <lambda>\n",
                "<short-lived-def>(3): short_lived\n",
                "<short-lived-exec>(3): <module>\n",
                "py_short_lived.py(",
            ] {
                assert!(all.contains(needle), "{what}: no {needle:?} in\n{text}");
            }
            assert_eq!(want.len(), 4, "{what}: allocations in\n{text}");
            assert_eq!(
                rows.keys().collect::<Vec<_>>(),
                want.keys().collect::<Vec<_>>(),
                "{what}: rows"
            );
            for (addr, stack) in &want {
                assert_eq!(&rows[addr], stack, "{what}: Python stack of {addr:#x}");
            }
            eprintln!("python {what}: every frame is the program's own");
        }
    }
}
