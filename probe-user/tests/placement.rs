//! Probe placement records exactly what entry placement records (needs root; skipped loudly
//! otherwise). The simulated `halMemFree`/`halMemRelease` start with `test %rdi,%rdi`, so the
//! placement rule moves their probes to the `je` after it; `halMemAlloc`/`halMemCreate` start
//! with an emulated `push` and stay at the entry.

mod common;

use std::process::Command;

use common::*;

fn trace(dir: &std::path::Path, name: &str, placement: Option<&str>) -> (String, GroundTruth) {
    let log = dir.join(format!("{name}.log"));
    let out_dir = dir.join(name);
    let mut c = Command::new(env!("CARGO_BIN_EXE_memscope-bpf"));
    c.args([
        "--log-level=debug",
        "-o",
        out_dir.to_str().unwrap(),
        "--device=npu,cpu",
        "--",
    ])
    .arg(bin("workload"))
    .args([
        // One thread per device: each device's simulated allocator is then used by one
        // thread only, so both runs get the same addresses.
        "--threads",
        "2",
        "--devices",
        "2",
        "--steps",
        "3",
        "--allocs",
        "5",
        "--leaks",
        "1",
        "--host",
        "--create",
        "--log",
    ])
    .arg(&log);
    match placement {
        Some(p) => c.env("MEMSCOPE_BPF_PLACEMENT", p),
        None => c.env_remove("MEMSCOPE_BPF_PLACEMENT"),
    };
    let out = c.output().expect("run memscope-bpf");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let gt = parse_log(&log);
    let rows = rows_of(&out_dir, gt.pid);
    for (event, kinds) in [
        ("MALLOC", &["MALLOC", "CREATE"][..]),
        ("FREE", &["FREE", "RELEASE"][..]),
    ] {
        assert_eq!(
            memory_rows(&rows, event),
            gt_rows(&gt, kinds),
            "{name}: {event} rows differ from the workload's ground truth\n{stderr}"
        );
    }
    (stderr, gt)
}

/// (device, addr, size) of the ground truth: the same in both runs (the simulated driver is
/// deterministic; tids differ between runs, and host/handle addresses come from malloc, so
/// ASLR moves them: those are compared without the address).
fn shape(gt: &GroundTruth, kinds: &[&str]) -> Vec<(String, u64, u64)> {
    let mut v: Vec<_> = gt_rows(gt, kinds)
        .into_iter()
        .map(|(_, d, a, s)| (d, if a < 0x4000_0000_0000 { a } else { 0 }, s))
        .collect();
    v.sort();
    v
}

#[test]
fn placed_probes_record_the_same_rows_as_entry_probes() {
    if !require_root("placed_probes_record_the_same_rows_as_entry_probes") {
        return;
    }
    let _serial = serial();
    let dir = scratch("placement");
    let (entry_log, entry_gt) = trace(&dir, "entry", Some("entry"));
    let (placed_log, placed_gt) = trace(&dir, "placed", None);
    assert!(
        entry_log.contains("probe halMemFree at ")
            && entry_log.contains("at entry: MEMSCOPE_BPF_PLACEMENT=entry"),
        "{entry_log}"
    );
    assert!(
        placed_log.contains("(moved past test: je at +0x3 is emulated"),
        "the placed run did not move halMemFree's probe:\n{placed_log}"
    );
    for kinds in [&["MALLOC", "CREATE"][..], &["FREE", "RELEASE"][..]] {
        assert_eq!(shape(&entry_gt, kinds), shape(&placed_gt, kinds));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
