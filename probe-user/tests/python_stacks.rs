//! End-to-end: `--call-stack=python` on real CPython programs (tests/fixtures/python/
//! py_stacks.py calls the simulated HAL through ctypes from nested calls, a recursion, a
//! generator, coroutines, a method and a second thread). The program logs its own stack
//! (`traceback.extract_stack()` on the line of each HAL call); every MALLOC and FREE row's
//! `Call Stack(Python)` must be exactly that stack, frame by frame. In attach mode, py-spy
//! (an independent reader) dumps the stopped target inside one allocation's line and must
//! show the same frames.

mod common;

use std::{collections::BTreeMap, path::PathBuf, process::Command};

use common::*;

/// CPython interpreters to test with: 3.11 (required), 3.12 and 3.13 where installed.
fn interpreters() -> Vec<(String, PathBuf)> {
    let found = interpreters_of(&[11, 12, 13]);
    assert!(
        found.iter().any(|(v, _)| v == "3.11"),
        "no working python3.11 found (PATH or /root/.pyenv/versions)"
    );
    found
}

fn script() -> PathBuf {
    repo_root().join("tests/fixtures/python/py_stacks.py")
}

/// The program's own stacks: (event, address) -> msMemScope text, innermost first.
fn logged_stacks(log: &str) -> BTreeMap<(String, u64), String> {
    let mut out = BTreeMap::new();
    for line in log.lines() {
        let event = match line.split(' ').next() {
            Some("ALLOC") => "MALLOC",
            Some("FREE") => "FREE",
            _ => continue,
        };
        let fields = log_fields(line);
        let stack = line.split_once(" stack=").expect("stack field").1;
        out.insert(
            (event.to_string(), hex(fields["addr"])),
            frames_text(&parse_frames(stack)),
        );
    }
    out
}

/// `[["file",line,"name"],...]` (the script's JSON, no escapes in our paths and names).
fn parse_frames(json: &str) -> Vec<(String, u32, String)> {
    let inner = json.trim().trim_start_matches("[[").trim_end_matches("]]");
    inner
        .split("],[")
        .map(|f| {
            let parts: Vec<&str> = f.split(',').collect();
            assert_eq!(parts.len(), 3, "frame {f:?}");
            (
                parts[0].trim_matches('"').to_string(),
                parts[1].parse().unwrap(),
                parts[2].trim_matches('"').to_string(),
            )
        })
        .collect()
}

fn frames_text(frames: &[(String, u32, String)]) -> String {
    frames
        .iter()
        .map(|(file, line, name)| format!("{file}({line}): {name}\n"))
        .collect()
}

/// (event, address) -> Python stack column of the MALLOC and FREE rows of `pid`.
fn traced_stacks(out_dir: &std::path::Path, pid: u32) -> BTreeMap<(String, u64), String> {
    let pdir = process_dir(out_dir, pid).expect("process directory");
    let dump = std::fs::read_to_string(&find_files(&pdir, "memscope_dump_")[0]).unwrap();
    let rows = parse_dump_records(&dump);
    let mut out = BTreeMap::new();
    for r in rows.iter().filter(|r| r[1] == "MALLOC" || r[1] == "FREE") {
        assert!(
            out.insert((r[1].clone(), hex(&r[8])), r[10].clone())
                .is_none(),
            "two {} rows for {}",
            r[1],
            r[8]
        );
    }
    out
}

fn assert_same_stacks(
    what: &str,
    traced: &BTreeMap<(String, u64), String>,
    logged: &BTreeMap<(String, u64), String>,
) {
    // 10 allocations and 10 frees (11 each with the paused one).
    assert!(
        logged.len() >= 20,
        "{what}: only {} logged calls",
        logged.len()
    );
    assert_eq!(
        traced.keys().collect::<Vec<_>>(),
        logged.keys().collect::<Vec<_>>(),
        "{what}: rows"
    );
    for (key, want) in logged {
        assert_eq!(&traced[key], want, "{what}: Python stack of {key:?}");
    }
}

/// 3.11 keeps the state of the thread holding the GIL in `_PyRuntime.gilstate.tstate_current`,
/// which BPF reads with the interpreter list (a thread's remembered state that holds the GIL is
/// live): our table's offset must be where the interpreter's own `PyThreadState_Get()` is.
#[test]
fn the_311_gil_holders_state_is_where_the_table_says() {
    let offset = memscope_bpf::events::pystacks::layout_for(3, 11)
        .unwrap()
        .walk
        .tstate_current;
    let snippet = "import ctypes, sys\n\
        rt = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, '_PyRuntime'))\n\
        ctypes.pythonapi.PyThreadState_Get.restype = ctypes.c_void_p\n\
        at = ctypes.c_void_p.from_address(rt + int(sys.argv[1])).value or 0\n\
        print(ctypes.pythonapi.PyThreadState_Get(), at)\n";
    for (version, python) in interpreters().into_iter().filter(|(v, _)| v == "3.11") {
        let out = Command::new(&python)
            .args(["-c", snippet, &offset.to_string()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{version}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let words: Vec<u64> = text
            .split_whitespace()
            .map(|w| w.parse().unwrap())
            .collect();
        assert_ne!(words[0], 0, "{version}: no thread state");
        assert_eq!(
            words[1],
            words[0],
            "{version} ({}): _PyRuntime+{offset} is not the current thread state",
            python.display()
        );
        eprintln!("python {version}: the GIL holder's state at _PyRuntime+{offset}");
    }
}

#[test]
fn python_stacks_match_the_programs_own_tracebacks() {
    if !require_root("python_stacks_match_the_programs_own_tracebacks") {
        return;
    }
    let _serial = serial();
    for (version, python) in interpreters() {
        check_launch_mode(&version, &python, &format!("python_stacks_{version}"));
    }
}

/// Launch mode: py_stacks.py under `--call-stack=python`, every row's stack against the log.
fn check_launch_mode(version: &str, python: &std::path::Path, scratch_name: &str) {
    let dir = scratch(scratch_name);
    let log = dir.join("gt.log");
    let out_dir = dir.join("out");
    let out = run_tracer(&[
        "-o",
        out_dir.to_str().unwrap(),
        "--call-stack=python",
        "--",
        python.to_str().unwrap(),
        script().to_str().unwrap(),
        "--lib-dir",
        fixtures().join("lib").to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{version}: {stderr}");
    let text = std::fs::read_to_string(&log).unwrap();
    let pid: u32 = log_lines(&text, "SUMMARY")[0]["pid"].parse().unwrap();
    let logged = logged_stacks(&text);
    // The recursion, generator, coroutine, method and thread are all there.
    let all: String = logged.values().cloned().collect();
    for needle in [
        "): recurse\n",
        "): generate\n",
        "): inner_coro\n",
        "): outer_coro\n",
        "): grab\n",
        "): release\n",
        "): in_thread\n",
        "): callback\n",
        "): made_3\n",
    ] {
        assert!(all.contains(needle), "{version}: no {needle:?} in the log");
    }
    // The functions made one after another took fewer addresses than there were of them: a
    // code object freed and another made where it was, under another name.
    let made = &log_lines(&text, "MADE")[0];
    let count: usize = made["count"].parse().unwrap();
    let addresses: usize = made["addresses"].parse().unwrap();
    assert!(
        addresses < count,
        "{version}: no code object address reused: {made:?}"
    );
    assert_same_stacks(version, &traced_stacks(&out_dir, pid), &logged);
    eprintln!("python {version} ({}): stacks match", python.display());
}

/// py-spy from PATH, or beside the interpreter pip put it with.
fn py_spy(python: &std::path::Path) -> PathBuf {
    let beside = python.with_file_name("py-spy");
    if beside.is_file() {
        return beside;
    }
    PathBuf::from("py-spy")
}

#[test]
fn python_stacks_in_attach_mode_agree_with_py_spy() {
    if !require_root("python_stacks_in_attach_mode_agree_with_py_spy") {
        return;
    }
    let _serial = serial();
    let (_, python) = interpreters().remove(0);
    check_attach_mode(&python, "python_stacks_attach");
}

/// `--pid` mode: py_stacks.py started on its own, the tracer attached before its first HAL
/// call; every row's stack against the log, and py-spy's dump of the paused allocation.
fn check_attach_mode(python: &std::path::Path, scratch_name: &str) {
    let dir = scratch(scratch_name);
    let log = dir.join("gt.log");
    let go = dir.join("go");
    let resume = dir.join("resume");
    let out_dir = dir.join("out");
    let mut target = Command::new(python)
        .args([
            script().to_str().unwrap(),
            "--lib-dir",
            fixtures().join("lib").to_str().unwrap(),
            "--log",
            log.to_str().unwrap(),
            "--go",
            go.to_str().unwrap(),
            "--pause",
            resume.to_str().unwrap(),
            // Attach mode never holds the target at exit (docs/call-stacks.md).
            "--linger",
            "1",
        ])
        .spawn()
        .expect("start the Python target");
    let pid = target.id();
    wait_for_text(&log, "READY", 30);
    let tracer = attach_python_tracer(&out_dir, pid);
    std::fs::write(&go, b"").unwrap();
    let text = wait_for_text(&log, "PAUSED", 60);
    let paused_tid = log_lines(&text, "PAUSED")[0]["tid"].to_string();

    // py-spy stops the target (ptrace) and reads its frames itself.
    let dump = Command::new(py_spy(python))
        .args(["dump", "--json", "--pid", &pid.to_string()])
        .output()
        .expect("run py-spy (cargo xtask setup installs it)");
    assert!(
        dump.status.success(),
        "py-spy dump: {}",
        String::from_utf8_lossy(&dump.stderr)
    );
    let dump = String::from_utf8_lossy(&dump.stdout).into_owned();
    std::fs::write(&resume, b"").unwrap();
    assert!(target.wait().unwrap().success());
    let (code, stderr) = tracer.finish();
    assert_eq!(code, Some(0), "{stderr}");

    let text = std::fs::read_to_string(&log).unwrap();
    let logged = logged_stacks(&text);
    let traced = traced_stacks(&out_dir, pid);
    assert_same_stacks(
        &format!("attach mode, {}", python.display()),
        &traced,
        &logged,
    );

    // py-spy's view of the paused thread: wait_for <- pause <- paused_alloc (the HAL call's
    // line) <- ...; below `pause` it must be our row's stack.
    // The thread polls a file: py-spy may catch it inside the check (`exists`, a frame above
    // `wait_for`) as well as in `wait_for`'s sleep.
    let all_frames = py_spy_frames(&dump, &paused_tid);
    let spy = match all_frames.iter().position(|f| f.2 == "wait_for") {
        Some(at) => &all_frames[at..],
        None => &all_frames[..],
    };
    assert!(
        spy.len() > 3 && spy[0].2 == "wait_for" && spy[1].2 == "pause",
        "py-spy frames: {all_frames:?}"
    );
    let paused_alloc = logged
        .iter()
        .find(|(k, v)| {
            k.0 == "MALLOC"
                && v.starts_with(&format!("{}(", script().display()))
                && v.contains("): paused_alloc\n")
        })
        .map(|(k, _)| k.clone())
        .expect("the paused allocation");
    assert_eq!(
        traced[&paused_alloc],
        frames_text(&spy[2..]),
        "py-spy vs tracer"
    );
}

/// A python whose interpreter is linked into the executable (Debian's /usr/bin/python3: no
/// libpython is mapped), where `_PyRuntime` is found in the binary's own symbols.
fn static_python() -> Option<(String, PathBuf)> {
    let mut candidates: Vec<PathBuf> = vec!["/usr/bin/python3".into()];
    candidates.extend((11..=13).map(|m| PathBuf::from(format!("/usr/bin/python3.{m}"))));
    candidates.into_iter().find_map(|p| {
        // The interpreter's own view: its version, and whether any libpython is mapped.
        let out = Command::new(&p)
            .args([
                "-c",
                "import ctypes, sys; print('%d.%d' % sys.version_info[:2], \
                 'libpython' in open('/proc/self/maps').read())",
            ])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let (version, shared) = text.trim().split_once(' ')?;
        let known = ["3.11", "3.12", "3.13"].contains(&version);
        (out.status.success() && known && shared == "False").then(|| (version.to_string(), p))
    })
}

#[test]
fn a_statically_linked_python_has_the_same_stacks_in_both_modes() {
    let test = "a_statically_linked_python_has_the_same_stacks_in_both_modes";
    if !require_root(test) {
        return;
    }
    let Some((version, python)) = static_python() else {
        eprintln!("SKIPPED {test}: no statically linked python3.11-3.13 in /usr/bin");
        println!("SKIPPED {test}: no static python");
        return;
    };
    let _serial = serial();
    check_launch_mode(&version, &python, "python_stacks_static");
    check_attach_mode(&python, "python_stacks_static_attach");
}

/// (event, address, stack) of the program's HAL calls in its log's order.
fn logged_calls(log: &str) -> Vec<(String, u64, String)> {
    log.lines()
        .filter_map(|line| {
            let event = match line.split(' ').next() {
                Some("ALLOC") => "MALLOC",
                Some("FREE") => "FREE",
                _ => return None,
            };
            let stack = line.split_once(" stack=").expect("stack field").1;
            Some((
                event.to_string(),
                hex(log_fields(line)["addr"]),
                frames_text(&parse_frames(stack)),
            ))
        })
        .collect()
}

/// Calls made inside sub-interpreters (tests/fixtures/python/py_subinterp.py): on the main
/// thread, which also has a thread state in the main interpreter (suspended in the call that
/// runs the sub-interpreter, and used again after it while the sub-interpreter lives on), and
/// on a second thread. Each row's Python stack is the sub-interpreter's own frames, as the
/// program logged them, and the main interpreter's calls keep theirs; launch mode, 3.11
/// (`_xxsubinterpreters`), 3.12 and 3.13 (`_interpreters`).
#[test]
fn calls_in_sub_interpreters_have_the_sub_interpreters_frames() {
    if !require_root("calls_in_sub_interpreters_have_the_sub_interpreters_frames") {
        return;
    }
    let _serial = serial();
    for (version, python) in interpreters() {
        let (text, pid, traced) =
            trace_subinterp(&format!("python_stacks_subinterp_{version}"), &python, &[]);
        // The program did what it says: calls in two sub-interpreters, on two threads, and in
        // the main interpreter on the main thread after its sub-interpreter ran.
        let calls = log_lines(&text, "ALLOC")
            .into_iter()
            .chain(log_lines(&text, "FREE"))
            .map(|f| (f["interp"].to_string(), f["tid"].to_string()))
            .collect::<std::collections::BTreeSet<_>>();
        let main_tid = pid.to_string();
        assert!(
            calls.contains(&("0".into(), main_tid.clone())),
            "{version}: {text}"
        );
        let subs: Vec<_> = calls.iter().filter(|(i, _)| i != "0").collect();
        assert_eq!(subs.len(), 2, "{version}: {calls:?}");
        assert!(
            subs.iter().any(|(_, t)| *t == main_tid) && subs.iter().any(|(_, t)| *t != main_tid)
        );

        let logged = logged_calls(&text);
        assert_eq!(logged.len(), 12, "{version}: {text}");
        assert_eq!(traced, logged, "{version}: Python stacks, in order");
        eprintln!("python {version}: sub-interpreter stacks match");
    }
}

/// Runs py_subinterp.py (with `extra` arguments) under the tracer with `--call-stack=python`;
/// returns its log, its pid, and its MALLOC/FREE rows as (event, address, Python stack).
fn trace_subinterp(
    name: &str,
    python: &std::path::Path,
    extra: &[&str],
) -> (String, u32, Vec<(String, u64, String)>) {
    let dir = scratch(name);
    let log = dir.join("gt.log");
    let out_dir = dir.join("out");
    let script = repo_root().join("tests/fixtures/python/py_subinterp.py");
    let lib_dir = fixtures().join("lib");
    let mut args = vec![
        "-o",
        out_dir.to_str().unwrap(),
        "--call-stack=python",
        "--",
        python.to_str().unwrap(),
        script.to_str().unwrap(),
        "--lib-dir",
        lib_dir.to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = run_tracer(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {stderr}", python.display());
    let text = std::fs::read_to_string(&log).unwrap();
    let pid: u32 = log_lines(&text, "SUMMARY")[0]["pid"].parse().unwrap();
    let pdir = process_dir(&out_dir, pid).expect("process directory");
    let dump = std::fs::read_to_string(&find_files(&pdir, "memscope_dump_")[0]).unwrap();
    let traced = parse_dump_records(&dump)
        .into_iter()
        .filter(|r| r[1] == "MALLOC" || r[1] == "FREE")
        .map(|r| (r[1].clone(), hex(&r[8]), r[10].clone()))
        .collect();
    (text, pid, traced)
}

/// py_subinterp.py `--let-code-go`: the `run_string` code and each sub-interpreter's code are
/// freed right after its last call, before the tracer has read the call's records, and the
/// allocator hands their memory to new code objects. BPF sends each code object at its first
/// sight (docs/call-stacks.md), so every frame is still the program's own.
#[test]
fn frames_of_code_freed_with_its_sub_interpreter_are_the_programs_own() {
    if !require_root("frames_of_code_freed_with_its_sub_interpreter_are_the_programs_own") {
        return;
    }
    let _serial = serial();
    for (version, python) in interpreters() {
        let (text, _, traced) = trace_subinterp(
            &format!("python_stacks_freed_{version}"),
            &python,
            &["--let-code-go"],
        );
        let logged = logged_calls(&text);
        assert_eq!(traced, logged, "{version}: Python stacks, in order");
        eprintln!("python {version}: frames of freed code objects are the program's own");
    }
}

/// (file, line, function) of one thread in `py-spy dump --json` output, innermost first.
fn py_spy_frames(json: &str, os_tid: &str) -> Vec<(String, u32, String)> {
    let start = json
        .find(&format!("\"os_thread_id\": {os_tid},"))
        .unwrap_or_else(|| panic!("thread {os_tid} not in py-spy's dump:\n{json}"));
    let thread = &json[start..];
    let thread = &thread[..thread[1..]
        .find("\"os_thread_id\"")
        .map_or(thread.len(), |e| e + 1)];
    let value = |frame: &str, key: &str| -> String {
        let at = frame.find(&format!("\"{key}\": ")).expect(key) + key.len() + 4;
        let rest = &frame[at..];
        let end = rest.find([',', '\n']).unwrap();
        rest[..end].trim().trim_matches('"').to_string()
    };
    thread
        .split("\"name\": ")
        .skip(1)
        .map(|f| {
            let frame = format!("\"name\": {f}");
            (
                value(&frame, "filename"),
                value(&frame, "line").parse().unwrap(),
                value(&frame, "name"),
            )
        })
        .collect()
}

#[test]
fn a_process_without_python_says_so_in_the_python_column() {
    if !require_root("a_process_without_python_says_so_in_the_python_column") {
        return;
    }
    let _serial = serial();
    let dir = scratch("python_stacks_none");
    let log = dir.join("gt.log");
    let out_dir = dir.join("out");
    let out = run_tracer(&[
        "-o",
        out_dir.to_str().unwrap(),
        "--call-stack=python",
        "--",
        bin("workload").to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gt = parse_log(&log);
    let pdir = process_dir(&out_dir, gt.pid).expect("process directory");
    let mut memory = Vec::new();
    for f in find_files(&pdir, "memscope_dump_") {
        let dump = std::fs::read_to_string(&f).unwrap();
        memory.extend(
            parse_dump_records(&dump)
                .into_iter()
                .filter(|r| r[1] == "MALLOC" || r[1] == "FREE"),
        );
    }
    let mallocs = memory.iter().filter(|r| r[1] == "MALLOC").count();
    assert_eq!(mallocs, gt.of("MALLOC").len(), "MALLOC rows");
    for r in &memory {
        assert_eq!(r[10], "[python: no interpreter]\n", "{r:?}");
    }
}

#[test]
fn mixed_stacks_put_python_frames_in_place_of_the_interpreter_loop() {
    if !require_root("mixed_stacks_put_python_frames_in_place_of_the_interpreter_loop") {
        return;
    }
    let _serial = serial();
    for (version, python) in interpreters() {
        let dir = scratch(&format!("python_stacks_mixed_{version}"));
        let log = dir.join("gt.log");
        let out_dir = dir.join("out");
        let out = run_tracer(&[
            "-o",
            out_dir.to_str().unwrap(),
            "--call-stack=mixed",
            "--",
            python.to_str().unwrap(),
            script().to_str().unwrap(),
            "--lib-dir",
            fixtures().join("lib").to_str().unwrap(),
            "--log",
            log.to_str().unwrap(),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{version}: {stderr}");
        let text = std::fs::read_to_string(&log).unwrap();
        let pid: u32 = log_lines(&text, "SUMMARY")[0]["pid"].parse().unwrap();
        let logged = logged_stacks(&text);
        let pdir = process_dir(&out_dir, pid).expect("process directory");
        let dump = std::fs::read_to_string(&find_files(&pdir, "memscope_dump_")[0]).unwrap();
        let mut checked = 0;
        for r in parse_dump_records(&dump)
            .iter()
            .filter(|r| r[1] == "MALLOC" || r[1] == "FREE")
        {
            let what = format!("{version}: {} {}", r[1], r[8]);
            let want = &logged[&(r[1].clone(), hex(&r[8]))];
            // Both columns: the Python one is the program's own stack.
            assert_eq!(&r[10], want, "{what}: Python column");
            let lines: Vec<&str> = r[11].lines().collect();
            let is_py = |l: &str| l.contains(" [python] ");
            // The Python frames, in order, in the C column: `ADDR [python] FUNC at FILE:LINE`.
            let mixed: String = lines
                .iter()
                .filter(|l| is_py(l))
                .map(|l| {
                    let rest = l.split_once(" [python] ").unwrap().1;
                    let (func, loc) = rest.rsplit_once(" at ").unwrap();
                    let (file, line) = loc.rsplit_once(':').unwrap();
                    format!("{file}({line}): {func}\n")
                })
                .collect();
            assert_eq!(
                &mixed, want,
                "{what}: Python frames in the C column\n{}",
                r[11]
            );
            // Each loop that ran them is gone; C frames stay around them (ctypes calling the
            // HAL inside, the interpreter's start outside).
            assert!(
                !lines
                    .iter()
                    .any(|l| l.ends_with(" _PyEval_EvalFrameDefault")
                        || l.contains(" _PyEval_EvalFrameDefault at ")),
                "{what}: an interpreter loop frame is left\n{}",
                r[11]
            );
            let first_py = lines.iter().position(|l| is_py(l)).unwrap();
            let last_py = lines.iter().rposition(|l| is_py(l)).unwrap();
            assert!(
                lines[..first_py]
                    .iter()
                    .any(|l| l.contains("_ctypes_callproc")),
                "{what}: no ctypes frame inside the Python frames\n{}",
                r[11]
            );
            // The main thread starts at PyEval_EvalCode, the second one at thread_run, the
            // thread made in C at ctypes' callback (under the C function that called it).
            assert!(
                lines[last_py..]
                    .iter()
                    .any(|l| l.contains(" PyEval_EvalCode at ")
                        || l.contains(" thread_run at ")
                        || l.contains(" _CallPythonObject at ")),
                "{what}: no interpreter start outside the Python frames\n{}",
                r[11]
            );
            checked += 1;
        }
        assert_eq!(checked, logged.len(), "{version}: rows");
    }
}

#[test]
fn an_interpreter_of_unknown_version_is_named_in_the_python_column() {
    if !require_root("an_interpreter_of_unknown_version_is_named_in_the_python_column") {
        return;
    }
    let Some((version, python)) = interpreters_of(&[10]).pop() else {
        eprintln!("SKIPPED: no python3.10 here to stand for a version without a layout");
        return;
    };
    let _serial = serial();
    let dir = scratch("python_stacks_unknown");
    let log = dir.join("gt.log");
    let out_dir = dir.join("out");
    let out = run_tracer(&[
        "-o",
        out_dir.to_str().unwrap(),
        "--call-stack=python",
        "--",
        python.to_str().unwrap(),
        script().to_str().unwrap(),
        "--lib-dir",
        fixtures().join("lib").to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&log).unwrap();
    let pid: u32 = log_lines(&text, "SUMMARY")[0]["pid"].parse().unwrap();
    let logged = logged_stacks(&text);
    let traced = traced_stacks(&out_dir, pid);
    assert_eq!(
        traced.keys().collect::<Vec<_>>(),
        logged.keys().collect::<Vec<_>>(),
        "rows"
    );
    for (key, stack) in &traced {
        assert_eq!(
            stack,
            &format!("[python: unknown version {version}]\n"),
            "{key:?}"
        );
    }
}
