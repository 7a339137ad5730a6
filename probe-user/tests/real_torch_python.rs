//! Python stacks on the real-framework test bed: the released torch + torch_npu wheels on the
//! simulated CANN (tests/fixtures/python/torch_npu_train.py, as in real_torch.rs), traced with
//! `--call-stack=mixed` (launch mode) and `--call-stack=python` (`--pid`). The script records its
//! own stack (`traceback.extract_stack()`) on the very line that makes or drops each tensor and
//! on its `torch.npu.empty_cache()` line; the tracer's `Call Stack(Python)` of every framework
//! (PTA) and driver (HAL) row made there must be exactly that stack, and in the mixed view the
//! C column must hold the same Python frames between torch's C++ and the interpreter's start.

mod common;

use std::{
    collections::BTreeMap,
    fs,
    path::Path,
    process::{Command, Stdio},
};

use common::*;

const STEPS: u32 = 3;

/// The entry of torch_npu's memory report function (where PTA rows are made) in each wheel's
/// libtorch_npu.so, as gdb and objdump place it (see real_torch.rs), or capstone.
fn report_function(release: &str) -> u64 {
    // The aarch64 wheels of the arm64 VM (cargo xtask test-aarch64): as aarch64 objdump reads
    // them (docs/aarch64.md, "torch_npu on arm64").
    if cfg!(target_arch = "aarch64") {
        if release.ends_with("npu-2.8.0.post2") {
            return 0x2d51b20;
        } else if release.ends_with("npu-2.5.1") {
            return 0x1706450;
        }
        panic!("no independent figure for the aarch64 report function of {release}");
    }
    if release.ends_with("npu-2.8.0.post2") {
        0x32f42a0
    } else if release.ends_with("npu-2.5.1") {
        0x1c622c0
    } else {
        // capstone's reading (tests/tools/torch_npu_reading.py, tests/data/*.tsv).
        release
            .split_once("_npu-")
            .and_then(|(_, npu)| capstone_reading(npu))
            .unwrap_or_else(|| panic!("no independent figure for the report function of {release}"))
            .0
    }
}

/// A traced run: the script's log, the tracer's stderr, the rows and their two stack columns.
struct Run {
    log: String,
    stderr: String,
    rows: Vec<DumpRow>,
    /// Row id -> (Call Stack(Python), Call Stack(C)).
    stacks: BTreeMap<u64, (String, String)>,
}

impl Run {
    fn read(out_dir: &Path, log: String, stderr: String) -> Run {
        let pid: u32 = log_lines(&log, "READY")[0]["pid"].parse().unwrap();
        let pdir = process_dir(out_dir, pid).expect("process directory");
        let mut rows = BTreeMap::new();
        let mut stacks = BTreeMap::new();
        // Whole CSV records: the stack columns span lines. Device-less rows are copied into
        // every device's file: one copy each.
        for f in find_files(&pdir, "memscope_dump_") {
            for r in parse_dump_records(&fs::read_to_string(f).unwrap()) {
                assert_eq!(r.len(), 12, "12 columns in {r:?}");
                let id: u64 = r[0].parse().unwrap();
                stacks.insert(id, (r[10].clone(), r[11].clone()));
                rows.insert(id, dump_row(r));
            }
        }
        Run {
            rows: rows.into_values().collect(),
            stacks,
            log,
            stderr,
        }
    }

    fn py(&self, i: usize) -> &str {
        &self.stacks[&self.rows[i].id].0
    }

    fn c(&self, i: usize) -> &str {
        &self.stacks[&self.rows[i].id].1
    }
}

/// A CSV record as a [`DumpRow`] (what `parse_dump` makes of a one-line record).
fn dump_row(f: Vec<String>) -> DumpRow {
    let raw_attr = f[9].clone();
    let attr = raw_attr
        .strip_prefix('{')
        .and_then(|s| s.strip_suffix('}'))
        .map(|inner| {
            inner
                .split(',')
                .map(|kv| {
                    let (k, v) = kv.split_once(':').expect("k:v");
                    (k.to_string(), v.to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    DumpRow {
        id: f[0].parse().unwrap(),
        event: f[1].clone(),
        event_type: f[2].clone(),
        name: f[3].clone(),
        ts: f[4].parse().unwrap(),
        pid: f[5].parse().unwrap(),
        tid: f[6].parse().unwrap(),
        device: f[7].clone(),
        ptr: f[8].clone(),
        attr,
        raw_attr,
    }
}

/// Launch mode: `memscope-bpf --call-stack=... -- python torch_npu_train.py`.
fn launch(venv: &Path, dir: &Path, call_stack: &str) -> Run {
    let out_dir = dir.join("out");
    let log = dir.join("gt.log");
    let out = Command::new(TRACER)
        .args(["-o", out_dir.to_str().unwrap(), call_stack, "--"])
        .arg(venv.join("bin/python"))
        .arg(torch_script())
        .args([
            "--log",
            log.to_str().unwrap(),
            "--steps",
            &STEPS.to_string(),
            "--stacks",
        ])
        .envs(cann_env())
        .output()
        .expect("run memscope-bpf");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "tracer failed:\n{stderr}");
    Run::read(&out_dir, fs::read_to_string(&log).unwrap(), stderr)
}

/// The script started on its own, `memscope-bpf --pid` attached after torch_npu's lazy init.
fn attach(venv: &Path, dir: &Path, call_stack: &str) -> Run {
    let out_dir = dir.join("out");
    let log = dir.join("gt.log");
    let go = dir.join("go");
    let mut target = Command::new(venv.join("bin/python"))
        .arg(torch_script())
        .args([
            "--log",
            log.to_str().unwrap(),
            "--steps",
            &STEPS.to_string(),
            "--stacks",
        ])
        .args(["--wait-file", go.to_str().unwrap()])
        .envs(cann_env())
        .stdout(Stdio::null())
        .spawn()
        .expect("start python");
    let text = wait_for_text(&log, "READY", 180 * patience());
    let pid: u32 = log_lines(&text, "READY")[0]["pid"].parse().unwrap();
    assert_eq!(pid, target.id());
    let mut tracer = Background::spawn(&[
        "-o",
        out_dir.to_str().unwrap(),
        call_stack,
        "--pid",
        &pid.to_string(),
    ]);
    tracer.wait_for("attached to pid", 120 * patience());
    fs::write(&go, b"").unwrap();
    wait_for_exit(&mut target, 300 * patience());
    let (code, stderr) = tracer.finish();
    assert_eq!(code, Some(0), "{stderr}");
    Run::read(&out_dir, fs::read_to_string(&log).unwrap(), stderr)
}

/// Checks every row made on a line the script recorded against the script's own stack;
/// `mixed`: the C column too. Returns the number of rows checked and how many of them had a C
/// stack too short for the mixed view.
fn check(run: &Run, what: &str, mixed: Option<u64>) -> (usize, usize) {
    let rows = &run.rows;
    let ctx = |msg: String| {
        format!(
            "{what}: {msg}\n--- log:\n{}\n--- tracer:\n{}",
            run.log, run.stderr
        )
    };
    let script_file = torch_script().display().to_string();
    // Each tensor made or dropped: the next PTA row of that kind at its data_ptr(), in order.
    let mut made: Vec<(usize, String, String)> = Vec::new(); // (row, log name, stack)
    let mut checked = Vec::new();
    let mut next = 0;
    for line in run.log.lines() {
        let (kind, event) = match line.split(' ').next() {
            Some("ALLOC") => ("ALLOC", "MALLOC"),
            Some("FREE") => ("FREE", "FREE"),
            _ => continue,
        };
        let fields = log_fields(line);
        let ptr = hex(fields["ptr"]);
        let Some(pos) = rows[next..]
            .iter()
            .position(|r| r.event_type == "PTA" && r.event == event && r.addr() == ptr)
        else {
            panic!("{}", ctx(format!("no PTA {event} row for {line}")));
        };
        let i = next + pos;
        next = i + 1;
        let want = log_stack_text(line);
        assert!(
            want.starts_with(&format!("{script_file}(")),
            "{}",
            ctx(format!("the script's stack does not start in it: {want}"))
        );
        assert_eq!(
            run.py(i),
            want,
            "{}",
            ctx(format!("Python stack of {line}"))
        );
        if kind == "ALLOC" {
            made.push((i, fields["name"].to_string(), want));
        }
        checked.push(i);
    }
    assert_eq!(
        made.len(),
        3 * STEPS as usize,
        "{}",
        ctx("ALLOC lines".into())
    );

    // Each driver segment the allocator grew by: made for the next tensor, on its line.
    let mut segments = 0;
    let hal_mallocs =
        (0..rows.len()).filter(|&h| rows[h].event_type == "HAL" && rows[h].event == "MALLOC");
    for h in hal_mallocs {
        let Some((_, name, want)) = made.iter().find(|(i, _, _)| *i > h) else {
            panic!(
                "{}",
                ctx(format!(
                    "HAL segment {:#x} after every tensor",
                    rows[h].addr()
                ))
            );
        };
        assert_eq!(
            run.py(h),
            want,
            "{}",
            ctx(format!("HAL segment {:#x} for {name}", rows[h].addr()))
        );
        checked.push(h);
        segments += 1;
    }
    assert!(segments > 0, "{}", ctx("no HAL segment".into()));

    // Each operator's workspace block (aclnnAdd asks for one): allocated and freed on the
    // line that adds, in the main thread, before the task queue runs the operator.
    let sums: Vec<&String> = made
        .iter()
        .filter(|(_, n, _)| n.starts_with("sum"))
        .map(|(_, _, s)| s)
        .collect();
    let starts: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].event_type == "ACLNN_START" && rows[i].name == "aclnnAdd")
        .collect();
    assert_eq!(starts.len(), sums.len(), "{}", ctx("aclnnAdd rows".into()));
    for (&s, want) in starts.iter().zip(&sums) {
        let id = &rows[s].attr["workspace_allocation_id"];
        let m = (0..s)
            .rev()
            .find(|&j| {
                rows[j].event_type == "PTA"
                    && rows[j].event == "MALLOC"
                    && &rows[j].attr["allocation_id"] == id
            })
            .unwrap_or_else(|| panic!("{}", ctx(format!("no workspace block {id}"))));
        assert_eq!(run.py(m), *want, "{}", ctx(format!("workspace block {id}")));
        let f = (m + 1..rows.len())
            .find(|&j| {
                rows[j].event_type == "PTA"
                    && rows[j].event == "FREE"
                    && rows[j].addr() == rows[m].addr()
            })
            .unwrap_or_else(|| panic!("{}", ctx(format!("workspace block {id} never freed"))));
        assert_eq!(
            run.py(f),
            *want,
            "{}",
            ctx(format!("free of workspace block {id}"))
        );
        checked.extend([m, f]);
    }

    // empty_cache(): the segments it gives back are freed inside torch_npu's empty_cache
    // (where Python's code object puts that function), called from the script's line.
    let empty = run
        .log
        .lines()
        .find(|l| l.starts_with("EMPTY_CACHE "))
        .unwrap();
    let fields = log_fields(empty);
    let below = log_stack_text(empty);
    let (code_file, rest) = fields["code"].split_once(':').unwrap();
    let (code_name, lines) = rest.split_once(':').unwrap();
    let (first, last) = lines.split_once('-').unwrap();
    let (first, last): (u32, u32) = (first.parse().unwrap(), last.parse().unwrap());
    let site = &code_file[..code_file
        .find("/site-packages/")
        .expect("torch_npu in site-packages")];
    let seg_size: BTreeMap<u64, u64> = rows
        .iter()
        .filter(|r| r.event_type == "HAL" && r.event == "MALLOC")
        .map(|r| (r.addr(), r.size()))
        .collect();
    let mut given_back = 0;
    for e in (0..rows.len()).filter(|&i| rows[i].event_type == "HAL" && rows[i].event == "FREE") {
        let Some(inner) = run.py(e).strip_suffix(below.as_str()) else {
            continue;
        };
        let frames: Vec<&str> = inner.lines().collect();
        let outer = frames
            .last()
            .unwrap_or_else(|| panic!("{}", ctx(format!("no torch_npu frame in {}", run.py(e)))));
        let (file, line_name) = outer.split_once('(').unwrap();
        let (line, name) = line_name.split_once("): ").unwrap();
        let line: u32 = line.parse().unwrap();
        assert!(
            file == code_file && name == code_name && (first..=last).contains(&line),
            "{}",
            ctx(format!(
                "empty_cache frame {outer:?} (code {code_file}:{code_name}:{first}-{last})"
            ))
        );
        assert!(
            frames.iter().all(|f| f.starts_with(site)),
            "{}",
            ctx(inner.to_string())
        );
        given_back += seg_size[&rows[e].addr()];
        checked.push(e);
    }
    let before: u64 = log_lines(&run.log, "STEP").last().unwrap()["reserved"]
        .parse()
        .unwrap();
    let after: u64 = fields["reserved"].parse().unwrap();
    assert!(
        before > after,
        "{}",
        ctx("empty_cache gave nothing back".into())
    );
    assert_eq!(
        given_back,
        before - after,
        "{}",
        ctx("segments freed in empty_cache".into())
    );

    let mut cut = 0;
    if let Some(report) = mixed {
        for &i in &checked {
            if !check_mixed(run, i, report, &ctx) {
                cut += 1;
            }
        }
    }
    (checked.len(), cut)
}

/// The mixed view of row `i`: its Python frames, in order, in the C column where the
/// interpreter loop ran them, torch's C++ inside them, the interpreter's start outside.
/// Returns false for a row whose C stack ends before the interpreter loop (a stack deeper than
/// the copy can hold: docs/call-stacks.md): no Python frame has a place in its C column then,
/// and none may be there.
fn check_mixed(run: &Run, i: usize, report: u64, ctx: &dyn Fn(String) -> String) -> bool {
    let (py, c) = (run.py(i), run.c(i));
    let lines: Vec<&str> = c.lines().collect();
    let is_py = |l: &str| l.contains(" [python] ");
    let row = format!(
        "{} {} {:#x}",
        run.rows[i].event,
        run.rows[i].event_type,
        run.rows[i].addr()
    );
    if lines.last() == Some(&"[truncated]")
        && !lines
            .iter()
            .any(|l| is_py(l) || l.contains(" _PyEval_EvalFrameDefault"))
    {
        // Counted by the caller (none may be cut). Such a row still starts where it was made.
        if run.rows[i].event_type == "PTA" {
            assert!(
                lines[0].ends_with(&format!(" libtorch_npu.so+{report:#x}")),
                "{}",
                ctx(format!("{row}: innermost C frame of a cut stack\n{c}"))
            );
        }
        return false;
    }
    let mixed: String = lines
        .iter()
        .filter(|l| is_py(l))
        .map(|l| {
            let (func, loc) = l
                .split_once(" [python] ")
                .unwrap()
                .1
                .rsplit_once(" at ")
                .unwrap();
            let (file, line) = loc.rsplit_once(':').unwrap();
            format!("{file}({line}): {func}\n")
        })
        .collect();
    assert_eq!(
        mixed,
        py,
        "{}",
        ctx(format!("{row}: Python frames in the C column\n{c}"))
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.contains(" _PyEval_EvalFrameDefault")),
        "{}",
        ctx(format!("{row}: an interpreter loop frame is left\n{c}"))
    );
    let first_py = lines.iter().position(|l| is_py(l)).unwrap();
    let last_py = lines.iter().rposition(|l| is_py(l)).unwrap();
    // With its line where CPython has debug info (the x86-64 bed's), by name only where it is
    // stripped (Debian's python3.11 in the arm64 VM).
    assert!(
        lines[last_py..]
            .iter()
            .any(|l| l.contains(" PyEval_EvalCode at ") || l.ends_with(" PyEval_EvalCode")),
        "{}",
        ctx(format!(
            "{row}: no interpreter start outside the Python frames\n{c}"
        ))
    );
    if run.rows[i].event_type == "PTA" {
        // Where the row was made: torch_npu's report function, called from the allocator.
        assert!(
            lines[0].ends_with(&format!(" libtorch_npu.so+{report:#x}")),
            "{}",
            ctx(format!("{row}: innermost C frame\n{c}"))
        );
        assert!(
            lines[1..first_py]
                .iter()
                .any(|l| l.contains("libtorch_npu.so")),
            "{}",
            ctx(format!("{row}: no allocator frames\n{c}"))
        );
    }
    if run.rows[i].event == "MALLOC" {
        // A tensor is made by torch's Python binding of the op the line called.
        assert!(
            lines[..first_py]
                .iter()
                .any(|l| l.contains(" torch::autograd::THPVariable_")),
            "{}",
            ctx(format!(
                "{row}: no torch binding inside the Python frames\n{c}"
            ))
        );
    }
    true
}

#[test]
fn real_torch_python_stacks_in_launch_mode_mixed() {
    let test = "real_torch_python_stacks_in_launch_mode_mixed";
    let Some(venvs) = torch_venvs(test) else {
        return;
    };
    let _serial = serial();
    for venv in venvs {
        let release = bed_release(&venv);
        let dir = scratch(&format!("real-torch-python-launch-{release}"));
        let run = launch(&venv, &dir, "--call-stack=mixed");
        let (n, cut) = check(
            &run,
            &format!("launch, {release}"),
            // The copy reaches past the outermost interpreter loop: no stack is cut before
            // Python, whatever the release's allocator depth (2.14.0's loop is 9.4 KiB up).
            Some(report_function(&release)),
        );
        eprintln!(
            "{release}: {n} rows, Python stacks match the script's own, mixed view on {} \
             ({cut} rows with a C stack cut before the interpreter)",
            n - cut
        );
        assert_eq!(
            cut, 0,
            "{release}: {cut} of {n} rows have a C stack cut before Python"
        );
    }
}

#[test]
fn real_torch_python_stacks_in_attach_mode() {
    let test = "real_torch_python_stacks_in_attach_mode";
    let Some(venvs) = torch_venvs(test) else {
        return;
    };
    let _serial = serial();
    let venv = &venvs[0];
    let release = bed_release(venv);
    let dir = scratch(&format!("real-torch-python-attach-{release}"));
    let run = attach(venv, &dir, "--call-stack=python");
    let (n, _) = check(&run, &format!("--pid, {release}"), None);
    eprintln!("{release}: {n} rows, Python stacks match the script's own");
}
