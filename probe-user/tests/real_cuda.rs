//! PyPI's CUDA build of torch, unmodified, on the simulated CUDA of the test bed (`cargo xtask
//! setup` installs it: tests/fixtures/cuda, xtask/src/cuda_bed.rs): a training loop
//! (tests/fixtures/python/torch_cuda_train.py) is traced in launch mode and with `--pid`, and
//! every row is checked against what torch itself said in the script (`data_ptr()`,
//! `memory_allocated()`, `memory_reserved()`, the caching allocator's own segments from
//! `memory_snapshot()`): the c10 caching allocator's blocks are PTA rows (from
//! `c10::reportMemoryUsageToProfiler`), its segments CUDA rows (from `cudaMalloc`/`cudaFree`).

mod common;

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use common::*;

const STEPS: u32 = 5;

/// The bed's venv (`MEMSCOPE_CUDA_VENV`, set by `cargo xtask test`), or a loud skip.
fn cuda_venv(test: &str) -> Option<PathBuf> {
    if !require_root(test) {
        return None;
    }
    let Some(venv) = std::env::var_os("MEMSCOPE_CUDA_VENV").map(PathBuf::from) else {
        eprintln!(
            "SKIPPED {test}: MEMSCOPE_CUDA_VENV is not set (run through `cargo xtask test`, \
             which installs the CUDA test bed unless MEMSCOPE_CUDA_BED=off)"
        );
        println!("SKIPPED {test}: no CUDA test bed");
        return None;
    };
    assert!(
        venv.join("bin/python").is_file(),
        "MEMSCOPE_CUDA_VENV={} has no bin/python (`cargo xtask setup` installs it)",
        venv.display()
    );
    Some(venv)
}

fn script() -> PathBuf {
    repo_root().join("tests/fixtures/python/torch_cuda_train.py")
}

/// What marks the script's steps (python/memscope_steps.py).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Steps {
    /// NVTX push/pop of the bed's libnvToolsExt.so.1 (no mstx library in reach).
    Nvtx,
    /// mstx ranges of the fixtures' libms_tools_ext.so, put in reach by LD_LIBRARY_PATH.
    Mstx,
}

/// How a run is made and what it is checked for.
#[derive(Clone, Copy, Debug)]
struct Mode {
    steps: Steps,
    /// `--call-stack=python` and the script's own stacks; else `--analysis=leaks,decompose`.
    stacks: bool,
    /// `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`: the allocator's segments are the
    /// driver's `cuMemCreate` handles mapped into reserved ranges, not `cudaMalloc` blocks.
    expandable: bool,
}

const NVTX: Mode = Mode {
    steps: Steps::Nvtx,
    stacks: false,
    expandable: false,
};

fn script_env(mode: Mode) -> Vec<(String, String)> {
    let mut env = Vec::new();
    if mode.steps == Steps::Mstx {
        let lib = fixtures().join("lib").display().to_string();
        env.push(("LD_LIBRARY_PATH".into(), lib));
    }
    if mode.expandable {
        env.push((
            "PYTORCH_CUDA_ALLOC_CONF".into(),
            "expandable_segments:True".into(),
        ));
    }
    env
}

struct Run {
    log: String,
    stderr: String,
    rows: Vec<DumpRow>,
    /// Row id -> its Call Stack(Python) column.
    py_stacks: BTreeMap<u64, String>,
    /// The process's output directory.
    dir: PathBuf,
}

impl Run {
    fn read(out_dir: &Path, log: String, stderr: String) -> Run {
        let pid = ready_pid(&log);
        // Whole CSV records: the stack columns span lines.
        let mut py_stacks = BTreeMap::new();
        let dir = process_dir(out_dir, pid).unwrap();
        for f in find_files(&dir, "memscope_dump_") {
            for r in parse_dump_records(&fs::read_to_string(f).unwrap()) {
                py_stacks.insert(r[0].parse().unwrap(), r[10].clone());
            }
        }
        Run {
            rows: rows_of(out_dir, pid),
            py_stacks,
            dir,
            log,
            stderr,
        }
    }
}

/// The tracer's and the script's arguments for Python stacks (`traceback.extract_stack()` on
/// the line that makes or drops each tensor), or else for memory by owner (decompose).
fn stack_args(stacks: bool) -> (&'static [&'static str], &'static [&'static str]) {
    if stacks {
        (&["--call-stack=python"], &["--stacks"])
    } else {
        (&["--analysis=leaks,decompose"], &[])
    }
}

fn launch(venv: &Path, dir: &Path, mode: Mode) -> Run {
    let out_dir = dir.join("out");
    let log = dir.join("gt.log");
    let (tracer_args, script_args) = stack_args(mode.stacks);
    let out = Command::new(TRACER)
        .args(["-o", out_dir.to_str().unwrap()])
        .args(tracer_args)
        .arg("--")
        .arg(venv.join("bin/python"))
        .arg(script())
        .args([
            "--log",
            log.to_str().unwrap(),
            "--steps",
            &STEPS.to_string(),
        ])
        .args(script_args)
        .envs(script_env(mode))
        .output()
        .expect("run memscope-bpf");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "tracer failed:\n{stderr}");
    Run::read(&out_dir, fs::read_to_string(&log).unwrap(), stderr)
}

/// The script started on its own; `memscope-bpf --pid` attaches once CUDA is initialised.
fn attach(venv: &Path, dir: &Path, mode: Mode) -> Run {
    let out_dir = dir.join("out");
    let log = dir.join("gt.log");
    let go = dir.join("go");
    let (tracer_args, script_args) = stack_args(mode.stacks);
    let mut target = Command::new(venv.join("bin/python"))
        .arg(script())
        .args([
            "--log",
            log.to_str().unwrap(),
            "--steps",
            &STEPS.to_string(),
        ])
        .args(script_args)
        .args(["--wait-file", go.to_str().unwrap()])
        .envs(script_env(mode))
        .stdout(Stdio::null())
        .spawn()
        .expect("start python");
    let text = wait_for_text(&log, "READY", 180);
    let pid = ready_pid(&text);
    assert_eq!(pid, target.id());
    let pid_arg = pid.to_string();
    let mut args = vec!["-o", out_dir.to_str().unwrap(), "--pid", &pid_arg];
    args.extend(tracer_args);
    let mut tracer = Background::spawn(&args);
    tracer.wait_for("attached to pid", 120);
    fs::write(&go, b"").unwrap();
    wait_for_exit(&mut target, 300);
    let (code, stderr) = tracer.finish();
    assert_eq!(code, Some(0), "{stderr}");
    Run::read(&out_dir, fs::read_to_string(&log).unwrap(), stderr)
}

fn ready_pid(log: &str) -> u32 {
    log_lines(log, "READY")[0]["pid"].parse().unwrap()
}

fn num(fields: &BTreeMap<&str, &str>, key: &str) -> u64 {
    fields[key].parse().unwrap()
}

/// The mstx step of each row: "step start" ranges seen before it.
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

/// The CUDA runtime's device segments live after `rows`, as `0xADDR:SIZE` in address order
/// (the form of the script's `segments=`).
fn live_segments(rows: &[DumpRow]) -> String {
    let mut live = BTreeMap::new();
    for r in rows.iter().filter(|r| r.event_type == "CUDA") {
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
    live.iter()
        .map(|(a, s)| format!("{a:#x}:{s}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The driver memory live after `rows` against the script's figures at that moment: exactly
/// the allocator's own segments (`cudaMalloc` blocks), or with expandable segments the bytes of
/// the live `cuMemCreate` handles, which are `memory_reserved()`.
fn check_driver(rows: &[DumpRow], fields: &BTreeMap<&str, &str>, mode: Mode, ctx: &str) {
    if !mode.expandable {
        assert_eq!(live_segments(rows), fields["segments"], "{ctx}");
        return;
    }
    let mut live = BTreeMap::new();
    for r in rows.iter().filter(|r| r.event_type == "CUDA") {
        assert_eq!(
            r.attr.get("alloc_type").map_or("create", |t| t),
            "create",
            "{ctx}: {r:?}"
        );
        match r.event.as_str() {
            "MALLOC" => live.insert(r.addr(), r.size()),
            "FREE" => live.remove(&r.addr()),
            _ => None,
        };
    }
    assert!(!live.is_empty(), "{ctx}: no cuMemCreate handle live");
    assert_eq!(live.values().sum::<u64>(), num(fields, "reserved"), "{ctx}");
}

/// Checks a run row for row against the script's own log.
fn check(run: &Run, mode: Mode, what: &str) {
    let rows = &run.rows;
    let steps = mode.steps;
    let marked_by = log_lines(&run.log, "READY")[0]["steps"];
    assert_eq!(
        marked_by,
        format!("{steps:?}").to_lowercase(),
        "{what}: the script's steps"
    );
    let step_of = steps_of(rows);
    let ctx = |msg: &str| {
        format!(
            "{what}: {msg}\n--- log:\n{}\n--- tracer:\n{}",
            run.log, run.stderr
        )
    };
    let pta: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].event_type == "PTA")
        .collect();
    assert!(!pta.is_empty(), "{}", ctx("no PTA rows"));
    assert!(
        rows.iter().all(|r| r.event_type != "HAL"),
        "{}",
        ctx("the CUDA runtime's rows must say CUDA, not HAL")
    );

    // Every tensor the script made is one PTA MALLOC row at its data_ptr(), in order, in its
    // step, of the block size memory_allocated() grew by, with the allocator's totals after it.
    let mut next = 0;
    for a in log_lines(&run.log, "ALLOC") {
        let ptr = hex(a["ptr"]);
        let Some(pos) = pta[next..]
            .iter()
            .position(|&i| rows[i].event == "MALLOC" && rows[i].addr() == ptr)
        else {
            panic!("{}", ctx(&format!("no PTA MALLOC row for {a:?}")));
        };
        let i = pta[next + pos];
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
        assert_eq!(
            r.attr["used"],
            a["allocated"],
            "{}",
            ctx(&format!("used {a:?}"))
        );
        assert_eq!(
            r.attr["total"],
            a["reserved"],
            "{}",
            ctx(&format!("total {a:?}"))
        );
    }
    // Every tensor the script dropped is a PTA FREE row with the allocator's totals after it.
    for f in log_lines(&run.log, "FREE") {
        let ptr = hex(f["ptr"]);
        assert!(
            pta.iter().any(|&i| rows[i].event == "FREE"
                && rows[i].addr() == ptr
                && step_of[i] == num(&f, "step") as u32
                && rows[i].attr["used"] == f["allocated"]
                && rows[i].attr["total"] == f["reserved"]),
            "{}",
            ctx(&format!("no PTA FREE row for {f:?}"))
        );
    }
    // At the end of each step the last PTA row carries memory_allocated()/memory_reserved(),
    // and the live cudaMalloc segments are exactly the allocator's own segments.
    let ends: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].event == "MSTX" && rows[i].event_type == "Range_end")
        .collect();
    let steps = log_lines(&run.log, "STEP");
    assert_eq!(steps.len(), STEPS as usize);
    assert_eq!(ends.len(), STEPS as usize, "{}", ctx("step ends"));
    for (s, end) in steps.iter().zip(&ends) {
        let last = pta.iter().rev().find(|&&i| i < *end).unwrap();
        assert_eq!(
            rows[*last].attr["used"],
            s["allocated"],
            "{}",
            ctx(&format!("{s:?}"))
        );
        assert_eq!(
            rows[*last].attr["total"],
            s["reserved"],
            "{}",
            ctx(&format!("{s:?}"))
        );
        check_driver(&rows[..*end], s, mode, &ctx(&format!("CUDA {s:?}")));
    }
    // empty_cache() gives back the segments of no live tensor (cudaFree rows); what is live
    // before the interpreter drops the kept tensors at exit is what the allocator kept.
    let empty = &log_lines(&run.log, "EMPTY_CACHE")[0];
    let last_end = *ends.last().unwrap();
    let exit_frees = pta
        .iter()
        .copied()
        .find(|&i| i > last_end)
        .unwrap_or(rows.len());
    check_driver(
        &rows[..exit_frees],
        empty,
        mode,
        &ctx("CUDA segments after empty_cache"),
    );

    // The per-step leak report names every kept tensor with its step, and nothing else (a
    // block of the last step is never checked: no later step ends, as in msMemScope).
    let leaks: Vec<(u64, u32)> = log_lines(&run.log, "LEAK")
        .iter()
        .map(|l| (hex(l["ptr"]), num(l, "step") as u32))
        .filter(|(_, step)| *step < STEPS)
        .collect();
    let reported: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("Direct Pytorch Caching memory pool leak"))
        .collect();
    assert_eq!(reported.len(), leaks.len(), "{}", ctx("leak count"));
    for (ptr, step) in leaks {
        assert!(
            reported.iter().any(|l| l.contains(&format!("at {ptr:#x} "))
                && l.ends_with(&format!("at step {step}."))),
            "{}",
            ctx(&format!("leak {ptr:#x} of step {step} not reported"))
        );
    }
}

/// `--analysis=decompose`: at the end of every step the PTA owner holds memory_allocated() and
/// the CUDA runtime's memory (owner `CUDA`) memory_reserved().
fn check_decompose(run: &Run, what: &str) {
    let csv = find_files(&run.dir, "decompose_");
    assert_eq!(csv.len(), 1, "{what}: one decompose file");
    let text = fs::read_to_string(&csv[0]).unwrap();
    let owner = |step: &str, owner: &str| -> u64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{step},{owner},")))
            .unwrap_or_else(|| panic!("{what}: no {owner} in step {step}:\n{text}"));
        line.split(',').nth(2).unwrap().parse().unwrap()
    };
    for s in log_lines(&run.log, "STEP") {
        let (allocated, reserved) = (num(&s, "allocated"), num(&s, "reserved"));
        assert_eq!(owner(s["n"], "PTA"), allocated, "{what}: {s:?}\n{text}");
        assert_eq!(owner(s["n"], "CUDA"), reserved, "{what}: {s:?}\n{text}");
    }
}

#[test]
fn real_cuda_torch_launch() {
    let Some(venv) = cuda_venv("real_cuda_torch_launch") else {
        return;
    };
    let _guard = serial();
    for steps in [Steps::Nvtx, Steps::Mstx] {
        let dir = scratch(&format!("real_cuda_launch_{steps:?}"));
        let mode = Mode { steps, ..NVTX };
        let run = launch(&venv, &dir, mode);
        let what = format!("launch, {steps:?} steps");
        check(&run, mode, &what);
        check_decompose(&run, &what);
    }
}

#[test]
fn real_cuda_torch_attach() {
    let Some(venv) = cuda_venv("real_cuda_torch_attach") else {
        return;
    };
    let _guard = serial();
    let dir = scratch("real_cuda_attach");
    let run = attach(&venv, &dir, NVTX);
    check(&run, NVTX, "--pid, NVTX steps");
    check_decompose(&run, "--pid, NVTX steps");
}

/// torch's expandable segments: the caching allocator's memory is the driver's `cuMemCreate`
/// handles mapped (`cuMemMap`) into reserved ranges; the handles are CUDA rows that add up to
/// memory_reserved() and decompose's `CUDA` owner, the blocks PTA rows as before.
#[test]
fn real_cuda_torch_expandable_segments() {
    let Some(venv) = cuda_venv("real_cuda_torch_expandable_segments") else {
        return;
    };
    let _guard = serial();
    let mode = Mode {
        expandable: true,
        ..NVTX
    };
    let dir = scratch("real_cuda_expandable_launch");
    let run = launch(&venv, &dir, mode);
    check(&run, mode, "launch, expandable segments");
    check_decompose(&run, "launch, expandable segments");
    let dir = scratch("real_cuda_expandable_attach");
    let run = attach(&venv, &dir, mode);
    check(&run, mode, "--pid, expandable segments");
    check_decompose(&run, "--pid, expandable segments");
}

/// Every PTA row of a tensor the script made or dropped carries the script's own Python stack
/// on that line, exactly (the script's stack is shallower than the 16 frames kept).
fn check_python_stacks(run: &Run, what: &str) {
    let rows = &run.rows;
    let script_file = script().display().to_string();
    let mut next = 0;
    let mut checked = 0;
    for line in run.log.lines() {
        let event = match line.split(' ').next() {
            Some("ALLOC") => "MALLOC",
            Some("FREE") => "FREE",
            _ => continue,
        };
        let ptr = hex(log_fields(line)["ptr"]);
        let pos = rows[next..]
            .iter()
            .position(|r| r.event_type == "PTA" && r.event == event && r.addr() == ptr)
            .unwrap_or_else(|| panic!("{what}: no PTA {event} row for {line}\n{}", run.stderr));
        let i = next + pos;
        next = i + 1;
        let want = log_stack_text(line);
        assert!(
            want.starts_with(&format!("{script_file}(")),
            "{what}: {want}"
        );
        assert_eq!(
            run.py_stacks[&rows[i].id], want,
            "{what}: Python stack of {line}"
        );
        checked += 1;
    }
    // Three tensors made per step; three dropped in steps 1 and 2, two (one kept) after.
    let steps = STEPS as usize;
    assert_eq!(
        checked,
        3 * steps + 3 * 2 + 2 * (steps - 2),
        "{what}: rows checked"
    );
}

#[test]
fn real_cuda_torch_python_stacks() {
    let Some(venv) = cuda_venv("real_cuda_torch_python_stacks") else {
        return;
    };
    let _guard = serial();
    let mode = Mode {
        stacks: true,
        ..NVTX
    };
    let dir = scratch("real_cuda_stacks_launch");
    let run = launch(&venv, &dir, mode);
    check(&run, mode, "launch, Python stacks");
    check_python_stacks(&run, "launch");
    let dir = scratch("real_cuda_stacks_attach");
    let run = attach(&venv, &dir, mode);
    check(&run, mode, "--pid, Python stacks");
    check_python_stacks(&run, "--pid");
}

/// `--memory-snapshot` of a CUDA job against torch's own (`_record_memory_history` from the
/// first tensor, `_dump_snapshot` at the end, the cache kept): the same segments, blocks,
/// alloc/free actions in order, and script lines in their Python frames
/// (tests/tools/snapshot_check.py, in the bed's Python).
#[test]
fn real_cuda_snapshot_matches_torchs_own() {
    let Some(venv) = cuda_venv("real_cuda_snapshot_matches_torchs_own") else {
        return;
    };
    let _guard = serial();
    let dir = scratch("real_cuda_snapshot");
    let out_dir = dir.join("out");
    let theirs = dir.join("theirs.pickle");
    let log = dir.join("gt.log");
    let out = Command::new(TRACER)
        .args(["-o", out_dir.to_str().unwrap(), "--memory-snapshot"])
        .args(["--call-stack=python", "--"])
        .arg(venv.join("bin/python"))
        .arg(script())
        .args(["--log", log.to_str().unwrap(), "--keep-cache"])
        .args(["--snapshot", theirs.to_str().unwrap()])
        .output()
        .expect("run memscope-bpf");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tracer failed:\n{stderr}");
    let pid = ready_pid(&fs::read_to_string(&log).unwrap());
    let ours = process_dir(&out_dir, pid)
        .unwrap()
        .join("memory_snapshot.pickle");
    assert!(ours.is_file(), "no {}:\n{stderr}", ours.display());
    let check = Command::new(venv.join("bin/python"))
        .arg(repo_root().join("tests/tools/snapshot_check.py"))
        .arg("compare")
        .args([&ours, &theirs, &script()])
        .output()
        .expect("run snapshot_check.py");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(
        check.status.success(),
        "snapshot_check.py compare:\n{text}\n{stderr}"
    );
    eprintln!("{text}");
}

/// `--analysis=oom:3` when torch asks the (512 MiB) device for 1 TiB: the failed `cudaMalloc` is
/// an OOM_TRIGGER row, followed by the most recent allocations (the tensors the script holds,
/// newest first, and the segment made for one of them) and the largest live blocks, as the rows
/// before it say; torch itself raised its OutOfMemoryError.
#[test]
fn real_cuda_oom_report() {
    let Some(venv) = cuda_venv("real_cuda_oom_report") else {
        return;
    };
    let _guard = serial();
    let dir = scratch("real_cuda_oom");
    let out_dir = dir.join("out");
    let log = dir.join("gt.log");
    let out = Command::new(TRACER)
        .args(["-o", out_dir.to_str().unwrap(), "--analysis=oom:3", "--"])
        .arg(venv.join("bin/python"))
        .arg(script())
        .args(["--log", log.to_str().unwrap(), "--steps", "2", "--oom"])
        .env("CUDA_SIM_TOTAL_MIB", "512")
        .output()
        .expect("run memscope-bpf");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let log = fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("\nOOM message=CUDA_out_of_memory"),
        "torch did not raise its OOM error:\n{log}"
    );
    let rows = rows_of(&out_dir, ready_pid(&log));
    let trigger = rows
        .iter()
        .position(|r| r.event_type == "OOM_TRIGGER")
        .unwrap_or_else(|| panic!("no OOM_TRIGGER row\n{stderr}"));
    assert_eq!(rows[trigger].attr["func"], "cudaMalloc");
    assert!(rows[trigger].attr["req_size"].parse::<u64>().unwrap() >= 1 << 40);
    let detail = |ty: &str| -> Vec<(String, u64, u64)> {
        rows[trigger + 1..]
            .iter()
            .take_while(|r| r.event_type != "OOM_TRIGGER")
            .filter(|r| r.event_type == ty)
            .map(|r| {
                let size = r.attr["size"].parse().unwrap();
                (r.attr["pool"].clone(), hex(&r.attr["ptr"]), size)
            })
            .collect()
    };
    // The blocks live before the trigger (CUDA segments and PTA blocks), by time and by size.
    let mut live: BTreeMap<(String, u64), (u64, u64)> = BTreeMap::new();
    for (i, r) in rows[..trigger].iter().enumerate() {
        if !matches!(r.event_type.as_str(), "CUDA" | "PTA") {
            continue;
        }
        let key = (r.event_type.clone(), r.addr());
        match r.event.as_str() {
            "MALLOC" => live.insert(key, (r.size(), i as u64)),
            "FREE" => live.remove(&key),
            _ => None,
        };
    }
    let ranked = |by: &dyn Fn(&(u64, u64)) -> u64| -> Vec<(String, u64, u64)> {
        let mut v: Vec<_> = live.iter().collect();
        v.sort_by_key(|(_, v)| std::cmp::Reverse(by(v)));
        v.iter()
            .take(3)
            .map(|((ty, a), (s, _))| (ty.clone(), *a, *s))
            .collect()
    };
    assert_eq!(detail("OOM_RECENT_ALLOC"), ranked(&|v| v.1), "{stderr}");
    assert_eq!(detail("OOM_TOP_ALLOC"), ranked(&|v| v.0), "{stderr}");
    // The script's newest held tensor is the most recent allocation.
    let newest = log_lines(&log, "ALLOC")
        .last()
        .map(|a| hex(a["ptr"]))
        .unwrap();
    assert_eq!(detail("OOM_RECENT_ALLOC")[0].1, newest, "{stderr}");
}
