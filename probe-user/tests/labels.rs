//! End-to-end: decompose owner labels sent as mstx marks (probe-user/src/events/labels.rs) from two
//! threads, the weak `ops` tag of ATen accesses and an address relabel, against
//! tests/fixtures/src/label_workload.c, whose log gives each block's owner at allocation and
//! each owner's live bytes at exit.

mod common;

use std::collections::BTreeMap;

use common::*;

/// (address, owner) of the PTA MALLOC rows, in row order.
fn pool_owners(rows: &[Vec<String>]) -> Vec<(u64, String)> {
    rows.iter()
        .filter(|r| r[1] == "MALLOC" && r[2] == "PTA")
        .map(|r| {
            let owner = r[9]
                .trim_matches(|c| c == '{' || c == '}')
                .split(',')
                .find_map(|kv| kv.strip_prefix("owner:"))
                .unwrap()
                .to_string();
            (u64::from_str_radix(&r[8][2..], 16).unwrap(), owner)
        })
        .collect()
}

/// (address, owner) of the log's BLOCK lines.
fn logged_owners(text: &str) -> Vec<(u64, String)> {
    text.lines()
        .filter(|l| l.starts_with("BLOCK "))
        .map(|l| {
            let b = log_fields(l);
            (
                u64::from_str_radix(&b["addr"][2..], 16).unwrap(),
                b["owner"].to_string(),
            )
        })
        .collect()
}

#[test]
fn labels_from_marks_name_the_owners_of_blocks_and_the_breakdown() {
    if !require_root("labels_from_marks_name_the_owners_of_blocks_and_the_breakdown") {
        return;
    }
    let _serial = serial();
    let dir = scratch("labels");
    let log = dir.join("gt.log");
    let out_dir = dir.join("out");
    let out = run_tracer(&[
        "-o",
        out_dir.to_str().unwrap(),
        "--analysis=decompose",
        "--",
        bin("label_workload").to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let text = std::fs::read_to_string(&log).unwrap();
    let lines = |kind: &str| log_lines(&text, kind);
    let pid: u32 = lines("SUMMARY")[0]["pid"].parse().unwrap();
    let pdir = process_dir(&out_dir, pid).unwrap();
    let dump = std::fs::read_to_string(&find_files(&pdir, "memscope_dump_")[0]).unwrap();
    let rows = parse_dump_records(&dump);

    // Every pool block carries the owner it had when allocated.
    assert_eq!(pool_owners(&rows), logged_owners(&text));
    // Label marks are not MSTX rows.
    assert!(rows.iter().all(|r| !r[3].contains("memscope-label")));

    // The breakdown at exit: each owner's live bytes after the ops tags and the relabel, and
    // the pool owners add up to the live pool memory.
    let csv = std::fs::read_to_string(&find_files(&pdir, "decompose_")[0]).unwrap();
    let at_end: BTreeMap<String, u64> = csv
        .lines()
        .filter_map(|l| l.strip_prefix("end,"))
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[0].to_string(), f[1].parse().unwrap())
        })
        .filter(|(owner, bytes)| owner.starts_with("PTA") && *bytes > 0)
        .collect();
    let want: BTreeMap<String, u64> = lines("OWNER")
        .iter()
        .map(|o| (o["name"].to_string(), o["bytes"].parse().unwrap()))
        .collect();
    assert_eq!(at_end, want);
    let live: u64 = lines("BLOCK")
        .iter()
        .map(|b| b["size"].parse::<u64>().unwrap())
        .sum();
    assert_eq!(at_end.values().sum::<u64>(), live);
}

/// The same through CPython: python/memscope_labels.py used by a script that dlopens the
/// simulated libraries with ctypes (the tracer finds them as they are opened).
#[test]
fn python_programs_label_their_memory_with_memscope_labels() {
    if !require_root("python_programs_label_their_memory_with_memscope_labels") {
        return;
    }
    let _serial = serial();
    let dir = scratch("labels_py");
    let log = dir.join("gt.log");
    let out_dir = dir.join("out");
    let script = repo_root().join("tests/fixtures/python/label_train.py");
    let libs = fixtures().join("lib");
    let out = run_tracer(&[
        "-o",
        out_dir.to_str().unwrap(),
        "--analysis=decompose",
        "--",
        "python3",
        script.to_str().unwrap(),
        "--lib-dir",
        libs.to_str().unwrap(),
        "--log",
        log.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let text = std::fs::read_to_string(&log).unwrap();
    let pid: u32 = text
        .lines()
        .find_map(|l| l.strip_prefix("SUMMARY pid="))
        .unwrap()
        .parse()
        .unwrap();
    let pdir = process_dir(&out_dir, pid).unwrap();
    let dump = std::fs::read_to_string(&find_files(&pdir, "memscope_dump_")[0]).unwrap();
    let want = logged_owners(&text);
    assert_eq!(want.len(), 4);
    assert_eq!(pool_owners(&parse_dump_records(&dump)), want);
}

/// memscope_labels.py refuses bad labels and levels with ValueError, and is a no-op in a
/// process without mstx (nothing to trace, no error). Runs without root: no tracer involved.
#[test]
fn python_label_helper_rejects_bad_input_and_is_inert_without_mstx() {
    let script = r#"
import sys
import memscope_labels as ml
for label, level in [("x", 0), ("x", 8), ("@x", 1), ("a;b", 1), ("", 1), ("y" * 129, 2)]:
    try:
        ml.push(label, level)
    except ValueError as e:
        print("refused", repr(label[:3]), level, "|", e)
    else:
        sys.exit(f"accepted {label!r} at level {level}")
with ml.label("weights", ml.DETAIL_1):
    ml.tag_address(0x1000, "lora", ml.DETAIL_2)
print("inert ok")
"#;
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .env("PYTHONPATH", repo_root().join("python"))
        .output()
        .expect("python3 runs (cargo xtask setup checks it is installed)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.matches("refused").count(), 6, "{stdout}");
    assert!(stdout.contains("level must be 1..7"), "{stdout}");
    assert!(stdout.contains("not starting with '@'"), "{stdout}");
    assert!(stdout.ends_with("inert ok\n"), "{stdout}");
}
