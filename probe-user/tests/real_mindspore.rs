//! The released mindspore wheel from PyPI, unmodified, with its Ascend plugin on the simulated
//! CANN (`cargo xtask setup` installs it; tests/fixtures/cann): a training loop
//! (tests/fixtures/python/mindspore_train.py) is traced in launch mode and with `--pid`, with
//! MindSpore's virtual memory management on (its default) and off, and every MINDSPORE row is
//! checked against what the script itself printed (`data_ptr()`,
//! `mindspore.runtime.memory_allocated()`/`memory_reserved()`). Nothing is injected: the rows
//! come from probes on the pool's own exported functions.
//!
//! Skipped loudly when `MEMSCOPE_MINDSPORE_VENV` is not set (`cargo xtask test` sets it).

mod common;

use std::{
    collections::{BTreeMap, HashMap},
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use common::*;

const STEPS: u32 = 5;

/// How a run is made.
#[derive(Clone, Copy, Debug)]
struct Mode {
    /// `--pid` after the script's device init, instead of launching it.
    attach: bool,
    vmm: bool,
    /// `launch_blocking()`: operators (and their outputs' allocations) in the script's thread;
    /// by default on MindSpore's pipeline threads (the Python line is then the enqueuer's).
    blocking: bool,
    /// The script ends with `os._exit(0)`: the pool still holds its memory at the end.
    exit_now: bool,
}

struct Run {
    log: String,
    stderr: String,
    rows: Vec<DumpRow>,
    dir: PathBuf,
}

fn mindspore_venv(test: &str) -> Option<PathBuf> {
    if !require_root(test) {
        return None;
    }
    let Some(v) = std::env::var_os("MEMSCOPE_MINDSPORE_VENV") else {
        eprintln!(
            "SKIPPED {test}: MEMSCOPE_MINDSPORE_VENV is not set (run through `cargo xtask test`, \
             which installs the mindspore test bed unless MEMSCOPE_MINDSPORE_BED=off)"
        );
        println!("SKIPPED {test}: no mindspore test bed");
        return None;
    };
    let venv = PathBuf::from(v);
    assert!(
        venv.join("bin/python").is_file(),
        "MEMSCOPE_MINDSPORE_VENV names {}, which has no bin/python",
        venv.display()
    );
    Some(venv)
}

fn script() -> PathBuf {
    repo_root().join("tests/fixtures/python/mindspore_train.py")
}

fn script_args(log: &Path, mode: Mode) -> Vec<String> {
    let mut a = vec![
        script().display().to_string(),
        "--log".into(),
        log.display().to_string(),
        "--steps".into(),
        STEPS.to_string(),
    ];
    if !mode.vmm {
        a.push("--no-vmm".into());
    }
    if mode.blocking {
        a.push("--blocking".into());
    }
    if mode.exit_now {
        a.push("--exit-now".into());
    }
    a
}

fn run(venv: &Path, dir: &Path, mode: Mode) -> Run {
    let out_dir = dir.join("out");
    let log = dir.join("gt.log");
    if !mode.attach {
        let out = Command::new(TRACER)
            .args(["-o", out_dir.to_str().unwrap(), "--analysis=leaks", "--"])
            .arg(venv.join("bin/python"))
            .args(script_args(&log, mode))
            .envs(cann_env())
            .output()
            .expect("run memscope-bpf");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "tracer failed:\n{stderr}");
        let log = fs::read_to_string(&log).unwrap();
        let pid = ready(&log)["pid"].parse().unwrap();
        return Run {
            rows: rows_of(&out_dir, pid),
            dir: process_dir(&out_dir, pid).unwrap(),
            log,
            stderr,
        };
    }
    let go = dir.join("go");
    let mut target = Command::new(venv.join("bin/python"))
        .args(script_args(&log, mode))
        .args(["--wait-file", go.to_str().unwrap()])
        .envs(cann_env())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start python");
    let text = wait_for_text(&log, "READY", 180);
    let pid: u32 = ready(&text)["pid"].parse().unwrap();
    assert_eq!(pid, target.id());
    let mut tracer = Background::spawn(&[
        "-o",
        out_dir.to_str().unwrap(),
        "--analysis=leaks",
        "--pid",
        &pid.to_string(),
    ]);
    tracer.wait_for("attached to pid", 120);
    fs::write(&go, b"").unwrap();
    wait_for_exit(&mut target, 300);
    let (code, stderr) = tracer.finish();
    assert_eq!(code, Some(0), "{stderr}");
    Run {
        rows: rows_of(&out_dir, pid),
        dir: process_dir(&out_dir, pid).unwrap(),
        log: fs::read_to_string(&log).unwrap(),
        stderr,
    }
}

fn ready(log: &str) -> BTreeMap<&str, &str> {
    log_lines(log, "READY").swap_remove(0)
}

fn num(fields: &BTreeMap<&str, &str>, key: &str) -> u64 {
    fields[key].parse().unwrap()
}

/// The mstx step a row belongs to: "step start" ranges seen before it.
fn steps_of(rows: &[DumpRow]) -> Vec<u32> {
    let mut step = 0;
    rows.iter()
        .map(|r| {
            if r.event == "MSTX" && r.event_type == "Range_start" && r.name == "step start" {
                step += 1;
            }
            step
        })
        .collect()
}

/// Driver memory live at the end of `rows`: HAL blocks (VMM off) and physical handles (VMM on,
/// `halMemCreate`, `alloc_type:create`), both HAL rows.
fn live_driver(rows: &[DumpRow]) -> u64 {
    let mut live = HashMap::new();
    for r in rows.iter().filter(|r| r.event_type == "HAL") {
        match r.event.as_str() {
            "MALLOC" => {
                live.insert(r.addr(), r.size());
            }
            "FREE" => {
                live.remove(&r.addr());
            }
            _ => {}
        }
    }
    live.values().sum()
}

/// Checks a run row for row against the script's own log. In a `--pid` run the rows' `used`
/// is still MindSpore's memory_allocated() (the pool's own count, read by its probes, adds the
/// blocks made before the attach), and with VMM its `total` memory_reserved() (the physical
/// memory mapped before the attach read from MindSpore's VMM adapter; without VMM the pool's
/// reserved counters read by its probes), while the tracer sees only the blocks, and the
/// driver memory, made after it attached: those are MindSpore's figures less what it held at
/// READY.
fn check(run: &Run, what: &str, mode: Mode) {
    let rows = &run.rows;
    let step_of = steps_of(rows);
    let ctx = |msg: &str| {
        format!(
            "{what}: {msg}\n--- log:\n{}\n--- tracer:\n{}",
            run.log, run.stderr
        )
    };
    let ready = ready(&run.log);
    // MindSpore did not fall back to the CPU: its Ascend plugin loaded on the simulated CANN.
    assert_eq!(ready["device"], "Ascend", "{}", ctx("device target"));
    let (base_used, base_total) = if mode.attach {
        (num(&ready, "allocated"), num(&ready, "reserved"))
    } else {
        (0, 0)
    };
    let used = |f: &BTreeMap<&str, &str>| num(f, "allocated").to_string();
    let seen_used = |f: &BTreeMap<&str, &str>| (num(f, "allocated") - base_used).to_string();
    // `total` is memory_reserved() itself, also in a `--pid` run: with VMM the tracer reads
    // the physical memory mapped before the attach from MindSpore's VMM adapter, without VMM
    // the pool's probes read its reserved counters (the 1 GiB block taken before the attach).
    let total = |f: &BTreeMap<&str, &str>| num(f, "reserved").to_string();
    let seen_total = |f: &BTreeMap<&str, &str>| (num(f, "reserved") - base_total).to_string();
    assert!(
        !run.stderr.contains("pool functions"),
        "{}",
        ctx("the pool's functions were not found")
    );
    assert!(
        !run.stderr.contains("TotalMemStatistics()"),
        "{}",
        ctx("the pool's reserved counters were not found")
    );
    let ms: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].event_type == "MINDSPORE")
        .collect();
    assert!(!ms.is_empty(), "{}", ctx("no MINDSPORE rows"));

    // Every tensor the script made is one MINDSPORE MALLOC row at its data_ptr(), in order, in
    // its step, exactly the block memory_allocated() grew by, with the pool's totals after it:
    // the last block made at that address before the script saw the tensor (an operator may
    // take and give back a scratch block at the address its output then gets).
    let mut next = 0;
    for a in log_lines(&run.log, "ALLOC") {
        let ptr = hex(a["ptr"]);
        let Some(pos) = ms[next..].iter().rposition(|&i| {
            rows[i].event == "MALLOC" && rows[i].addr() == ptr && rows[i].ts <= num(&a, "t")
        }) else {
            panic!("{}", ctx(&format!("no MINDSPORE MALLOC row for {a:?}")));
        };
        let i = ms[next + pos];
        next += pos + 1;
        let r = &rows[i];
        assert_eq!(
            step_of[i],
            num(&a, "step") as u32,
            "{}",
            ctx(&format!("step of {a:?}"))
        );
        assert_eq!(r.device, "0");
        assert_eq!(
            r.size(),
            num(&a, "bytes"),
            "{}",
            ctx(&format!("size of {a:?}"))
        );
        assert_eq!(r.attr["used"], used(&a), "{}", ctx(&format!("used {a:?}")));
        // With VMM, MindSpore maps physical memory behind a block after AllocTensorMem
        // returned it (seen: the halMemCreate 80 us after the return), so the driver memory at
        // the block's row may not have grown yet; it has by the next FREE and step end.
        let row_total: u64 = r.attr["total"].parse().unwrap();
        let want: u64 = total(&a).parse().unwrap();
        assert!(
            row_total == want || (mode.vmm && row_total < want),
            "{}",
            ctx(&format!("total {row_total} of {a:?}"))
        );
    }
    // Every tensor the script dropped is a MINDSPORE FREE row with the totals after it.
    for f in log_lines(&run.log, "FREE") {
        let ptr = hex(f["ptr"]);
        assert!(
            ms.iter().any(|&i| rows[i].event == "FREE"
                && rows[i].addr() == ptr
                && step_of[i] == num(&f, "step") as u32
                && rows[i].attr["used"] == used(&f)
                && rows[i].attr["total"] == total(&f)),
            "{}",
            ctx(&format!("no MINDSPORE FREE row for {f:?}"))
        );
    }
    // At the end of each step the pool's live blocks (as the rows tell them) are the kept
    // tensors (and the READY tensor when traced from the start), adding up to
    // memory_allocated() (less the READY tensor with `--pid`); the live driver memory is memory_reserved(), in HAL blocks with VMM
    // off and physical handles with VMM on.
    let ends: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].event == "MSTX" && rows[i].event_type == "Range_end")
        .collect();
    let steps = log_lines(&run.log, "STEP");
    assert_eq!(steps.len(), STEPS as usize);
    assert_eq!(ends.len(), STEPS as usize, "{}", ctx("step ends"));
    for (s, &end) in steps.iter().zip(&ends) {
        let mut live = HashMap::new();
        for &i in ms.iter().filter(|&&i| i < end) {
            if rows[i].event == "MALLOC" {
                live.insert(rows[i].addr(), rows[i].size());
            } else {
                live.remove(&rows[i].addr());
            }
        }
        assert_eq!(
            live.values().sum::<u64>().to_string(),
            seen_used(s),
            "{}",
            ctx(&format!("live pool blocks at {s:?}"))
        );
        assert_eq!(
            live_driver(&rows[..end]).to_string(),
            seen_total(s),
            "{}",
            ctx(&format!("driver memory at {s:?}"))
        );
    }
    // VMM as asked: physical handles mapped into reserved ranges, or one big block.
    let creates = rows
        .iter()
        .filter(|r| {
            r.event_type == "HAL" && r.attr.get("alloc_type").map(String::as_str) == Some("create")
        })
        .count();
    let blocks = rows
        .iter()
        .filter(|r| {
            r.event_type == "HAL" && r.attr.get("alloc_type").map(String::as_str) == Some("alloc")
        })
        .count();
    if mode.attach {
        // The first block (VMM off) was taken before the attach.
        assert_eq!(blocks, 0, "{}", ctx("HAL blocks"));
    } else if mode.vmm {
        assert!(
            creates > 0 && blocks == 0,
            "{}",
            ctx("VMM on: handles only")
        );
    } else {
        assert!(
            creates == 0 && blocks > 0,
            "{}",
            ctx("VMM off: blocks only")
        );
    }

    // With VMM every pool block lies in a range the runtime reserved (aclrtReserveMemAddress,
    // the simulated CANN's part of the address space from 0x600000000000), which its row
    // names; without VMM none does. MindSpore reserves its range once, at device init: a
    // `--pid` run, attached after that, cannot know it and names none.
    for &i in ms.iter().filter(|&&i| rows[i].event == "MALLOC") {
        let r = &rows[i];
        match r.attr.get("vmm_range") {
            Some(range) if mode.vmm => {
                let start = hex(range);
                assert!(
                    start >= 0x6000_0000_0000 && start <= r.addr(),
                    "{}",
                    ctx(&format!("range of {r:?}"))
                );
            }
            None if !mode.vmm || mode.attach => {}
            _ => panic!("{}", ctx(&format!("vmm_range of {r:?}"))),
        }
    }

    // Each aclnnAdd got its workspace (1 MiB, tests/fixtures/cann/cann_opapi.c) as a pool
    // block of its own made before it, named by its allocation id, and with VMM (launch
    // mode) in a reserved range.
    for (i, r) in rows
        .iter()
        .enumerate()
        .filter(|(_, r)| r.event_type == "ACLNN_START" && r.name == "aclnnAdd")
    {
        assert_eq!(
            r.attr["workspace_size"],
            "1048576",
            "{}",
            ctx("workspace size")
        );
        let ws = hex(&r.attr["workspace_addr"]);
        let id = r.attr.get("workspace_allocation_id");
        assert!(
            ms.iter().any(|&j| j < i
                && rows[j].event == "MALLOC"
                && rows[j].addr() == ws
                && Some(&rows[j].attr["allocation_id"]) == id),
            "{}",
            ctx(&format!("workspace block of {r:?}"))
        );
        if mode.vmm && !mode.attach {
            let start = hex(&r.attr["vmm_range"]);
            assert!(start <= ws, "{}", ctx(&format!("workspace range of {r:?}")));
        }
    }

    // The operators the script ran, in order.
    for op in ["aclnnAdd", "aclnnMul"] {
        let rows_ops = rows
            .iter()
            .filter(|r| r.event_type == "ACLNN_START" && r.name == op)
            .count();
        let script_ops = log_lines(&run.log, "OP")
            .iter()
            .filter(|o| o["name"] == op)
            .count();
        assert_eq!(rows_ops, script_ops, "{}", ctx(op));
    }

    // The per-step leak report names every kept tensor with its step (not one from the last
    // step: no later step ends), and nothing else, with the script's line that made it: in
    // the script's thread (launch_blocking) or, by default, on MindSpore's pipeline threads
    // for the line that enqueued the operator.
    let leaks: Vec<(u64, u32, String)> = log_lines(&run.log, "LEAK")
        .iter()
        .map(|l| (hex(l["ptr"]), num(l, "step") as u32, l["name"].to_owned()))
        .filter(|(_, step, _)| *step < STEPS)
        .collect();
    let reported: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("Direct Mindspore memory pool leak"))
        .collect();
    assert_eq!(reported.len(), leaks.len(), "{}", ctx("leak count"));
    let csv: String = find_files(&run.dir, "leaks_")
        .iter()
        .map(|f| fs::read_to_string(f).unwrap())
        .collect();
    let lines = log_lines(&run.log, "ALLOC");
    for (ptr, step, name) in leaks {
        assert!(
            reported.iter().any(|l| l.contains(&format!("at {ptr:#x} "))
                && l.ends_with(&format!("at step {step}."))),
            "{}",
            ctx(&format!("leak {ptr:#x} of step {step} not reported"))
        );
        let row = csv
            .lines()
            .find(|l| l.contains(&format!("{ptr:#018x}")) && l.contains(",MINDSPORE,"))
            .unwrap_or_else(|| panic!("{}", ctx(&format!("{ptr:#x} not in leaks_*.csv"))));
        let cols: Vec<&str> = row.split(',').collect();
        assert_eq!(cols[6], step.to_string(), "{}", ctx(row));
        let line = lines.iter().find(|a| a["name"] == name).unwrap()["line"];
        let site = format!("{}:{line}", script().display());
        assert_eq!(cols[11], site, "{}", ctx(&format!("site of {name}")));
    }
}

fn one(test: &str, mode: Mode) {
    let Some(venv) = mindspore_venv(test) else {
        return;
    };
    let dir = scratch(test);
    let run = run(&venv, &dir, mode);
    check(&run, &format!("{test} {mode:?}"), mode);
}

#[test]
fn real_mindspore_launch_vmm() {
    one(
        "real_mindspore_launch_vmm",
        Mode {
            attach: false,
            vmm: true,
            blocking: false,
            exit_now: false,
        },
    );
}

#[test]
fn real_mindspore_launch_no_vmm_blocking() {
    one(
        "real_mindspore_launch_no_vmm_blocking",
        Mode {
            attach: false,
            vmm: false,
            blocking: true,
            exit_now: false,
        },
    );
}

#[test]
fn real_mindspore_attach_vmm_blocking() {
    one(
        "real_mindspore_attach_vmm_blocking",
        Mode {
            attach: true,
            vmm: true,
            blocking: true,
            exit_now: false,
        },
    );
}

#[test]
fn real_mindspore_attach_no_vmm() {
    one(
        "real_mindspore_attach_no_vmm",
        Mode {
            attach: true,
            vmm: false,
            blocking: false,
            exit_now: false,
        },
    );
}

/// A release whose pool library does not export the pool's functions: one warning, and the
/// run goes on (no MINDSPORE rows, the driver's as before). A small object with no such
/// function stands in for it under the pool library's name.
#[test]
fn mindspore_pool_without_its_functions_is_one_warning() {
    if !require_root("mindspore_pool_without_its_functions_is_one_warning") {
        return;
    }
    let dir = scratch("mindspore-pool-stripped");
    let lib = dir.join("libmindspore_memory_pool.so");
    fs::copy(fixtures().join("lib/libplugin.so"), &lib).unwrap();
    let out = run_tracer(&[
        "-o",
        dir.join("out").to_str().unwrap(),
        "--",
        "python3",
        "-c",
        &format!(
            "import ctypes; ctypes.CDLL({lib:?}); ctypes.CDLL({lib:?})",
            lib = lib.display().to_string()
        ),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let warnings = stderr
        .lines()
        .filter(|l| l.contains("MindSpore's pool functions"))
        .count();
    assert_eq!(warnings, 1, "{stderr}");
}

/// With VMM, the physical memory MindSpore mapped behind its blocks is the pool's, cached: at
/// an abrupt end (`os._exit`, the pool still holding everything) the leak report calls none of
/// it leaked driver memory, counts it all as the pool's segments (memory_reserved()), and names
/// the tensors still live (memory_allocated()).
#[test]
fn real_mindspore_vmm_memory_is_the_pools() {
    let test = "real_mindspore_vmm_memory_is_the_pools";
    let Some(venv) = mindspore_venv(test) else {
        return;
    };
    let dir = scratch(test);
    let mode = Mode {
        attach: false,
        vmm: true,
        blocking: false,
        exit_now: true,
    };
    let run = run(&venv, &dir, mode);
    let end = &log_lines(&run.log, "END")[0];
    let ctx = |msg: &str| format!("{msg}\n--- log:\n{}\n--- tracer:\n{}", run.log, run.stderr);
    assert!(
        run.stderr
            .contains("0 driver block(s) no pool owns leaked, 0 bytes"),
        "{}",
        ctx("driver memory called leaked")
    );
    let pool = run
        .stderr
        .lines()
        .find(|l| l.contains("MINDSPORE pool on device 0 at exit"))
        .unwrap_or_else(|| panic!("{}", ctx("no MINDSPORE pool line")));
    assert!(
        pool.contains(&format!(
            "segment(s) of driver memory, {}",
            human(num(end, "reserved"))
        )),
        "{}",
        ctx(pool)
    );
    // The kept tensors and the READY tensor.
    let live = log_lines(&run.log, "LEAK").len() + 1;
    assert!(
        pool.contains(&format!(
            "{} in {live} live block(s)",
            human(num(end, "allocated"))
        )),
        "{}",
        ctx(pool)
    );
}

/// `30.00 MiB (31457280 bytes)`, as the tracer writes sizes.
fn human(bytes: u64) -> String {
    format!(
        "{:.2} MiB ({bytes} bytes)",
        bytes as f64 / (1u64 << 20) as f64
    )
}
