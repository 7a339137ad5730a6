//! End-to-end: decompose owner labels sent as mstx marks (probe-user/src/labels.rs) from two
//! threads, the weak `ops` tag of ATen accesses and an address relabel, against
//! tests/fixtures/src/label_workload.c, whose log gives each block's owner at allocation and
//! each owner's live bytes at exit.

mod common;

use std::collections::BTreeMap;

use common::*;

fn fields(line: &str) -> BTreeMap<&str, &str> {
    line.split(' ')
        .skip(1)
        .filter_map(|kv| kv.split_once('='))
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
    let lines = |kind: &str| -> Vec<BTreeMap<&str, &str>> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{kind} ")))
            .map(fields)
            .collect()
    };
    let pid: u32 = lines("SUMMARY")[0]["pid"].parse().unwrap();
    let pdir = process_dir(&out_dir, pid).unwrap();
    let dump = std::fs::read_to_string(&find_files(&pdir, "memscope_dump_")[0]).unwrap();
    let rows = parse_dump_records(&dump);

    // Every pool block carries the owner it had when allocated.
    let mallocs: Vec<(u64, String)> = rows
        .iter()
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
        .collect();
    let want: Vec<(u64, String)> = lines("BLOCK")
        .iter()
        .map(|b| {
            (
                u64::from_str_radix(&b["addr"][2..], 16).unwrap(),
                b["owner"].to_string(),
            )
        })
        .collect();
    assert_eq!(mallocs, want);
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
