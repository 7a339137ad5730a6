//! End-to-end: framework pools reported through the mstx memory API (simulated caching
//! allocator in tests/fixtures/src/pool_workload.c), read by BPF from the target's structs.

mod common;

use std::collections::BTreeMap;

use common::*;

/// (tid, device, addr, size) of the region lines of a pool_workload log.
fn gt_regions(log: &std::path::Path, kind: &str) -> Vec<(u32, String, u64, u64)> {
    let text = std::fs::read_to_string(log).unwrap();
    let mut v: Vec<_> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{kind} ")))
        .map(|l| {
            let f: BTreeMap<&str, &str> = l
                .split(' ')
                .skip(1)
                .filter_map(|kv| kv.split_once('='))
                .collect();
            (
                f["tid"].parse().unwrap(),
                f["dev"].to_string(),
                u64::from_str_radix(f["addr"].trim_start_matches("0x"), 16).unwrap(),
                f["size"].parse().unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

fn pool_rows(rows: &[DumpRow], event: &str, event_type: &str) -> Vec<(u32, String, u64, u64)> {
    let mut v: Vec<_> = rows
        .iter()
        .filter(|r| r.event == event && r.event_type == event_type)
        .map(|r| (r.tid, r.device.clone(), r.addr(), r.size()))
        .collect();
    v.sort();
    v
}

/// Traces the pool workload; returns the scratch directory (kept alive for the caller), the
/// output directory in it, the workload's pid, the tracer's stderr and the workload's log.
fn trace_pool(
    pool: &str,
    extra: &[&str],
) -> (
    common::Scratch,
    std::path::PathBuf,
    u32,
    String,
    std::path::PathBuf,
) {
    let dir = scratch(&format!("pool-{pool}"));
    let log = dir.join("gt.log");
    let out_dir = dir.join("out");
    let mut args = vec!["-o", out_dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    let workload = bin("pool_workload");
    args.extend_from_slice(&[
        "--",
        workload.to_str().unwrap(),
        "--pool",
        pool,
        "--devices",
        "2",
        "--steps",
        "3",
        "--blocks",
        "20",
        "--batch",
        "20",
        "--leak-from-step",
        "2",
        "--log",
        log.to_str().unwrap(),
    ]);
    let out = run_tracer(&args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let pid = parse_log(&log).pid;
    (dir, out_dir, pid, stderr, log)
}

#[test]
fn every_pool_kind_gives_one_row_per_region_with_pool_accounting() {
    if !require_root("every_pool_kind_gives_one_row_per_region_with_pool_accounting") {
        return;
    }
    let _serial = serial();
    for (pool, event_type, name) in [
        ("pta", "PTA", "Pytorch Caching memory pool"),
        ("workspace", "PTA", ""),
        ("mindspore", "MINDSPORE", "Mindspore memory pool"),
        ("atb", "ATB", "ATB memory pool"),
    ] {
        let (_dir, out_dir, pid, stderr, log) = trace_pool(pool, &[]);
        let rows = rows_of(&out_dir, pid);
        // 20 regions per call: several chunks per batch, every region a row.
        assert_eq!(
            pool_rows(&rows, "MALLOC", event_type),
            gt_regions(&log, "REGION_MALLOC"),
            "{pool}"
        );
        assert_eq!(
            pool_rows(&rows, "FREE", event_type),
            gt_regions(&log, "REGION_FREE"),
            "{pool}"
        );
        assert_eq!(gt_regions(&log, "REGION_MALLOC").len(), 120);
        // used/total per the pool's rules (§1.6).
        let mallocs: Vec<_> = rows
            .iter()
            .filter(|r| r.event == "MALLOC" && r.event_type == event_type)
            .collect();
        for r in &mallocs {
            assert_eq!(
                r.attr["total"], "67108864",
                "{pool}: the heap registered per device"
            );
        }
        let dev0: Vec<_> = mallocs.iter().filter(|r| r.device == "0").collect();
        let first_step: u64 = dev0[..20].iter().map(|r| r.size()).sum();
        let last = dev0[19].attr["used"].parse::<u64>().unwrap();
        if pool == "workspace" {
            assert_eq!(last, dev0[19].size(), "workspace reports its current size");
        } else {
            assert_eq!(last, first_step, "{pool}: used adds up the regions");
        }
        // Step leaks: the step-2 block of each device survived step 3; the step-3 ones have not
        // outlived a step yet. The workspace pool is not analysed.
        if name.is_empty() {
            assert!(!stderr.contains("Detected memory leaks"), "{stderr}");
        } else {
            for dev in ["0", "1"] {
                assert!(
                    stderr.contains(&format!(
                        "====== ERROR: Detected memory leaks on device {dev} ======"
                    )),
                    "{stderr}"
                );
            }
            assert_eq!(
                stderr.matches(&format!("Direct {name} leak of")).count(),
                2,
                "{stderr}"
            );
            assert_eq!(stderr.matches("at step 2.").count(), 2, "{stderr}");
            assert!(
                stderr.contains(&format!("{name} Gap Analysis of Device 0")),
                "{stderr}"
            );
        }
    }
}

#[test]
fn legacy_domain_name_maps_to_the_caching_pool() {
    if !require_root("legacy_domain_name_maps_to_the_caching_pool") {
        return;
    }
    let _serial = serial();
    let dir = scratch("pool-legacy");
    let log = dir.join("gt.log");
    let out_dir = dir.join("out");
    let out = run_tracer(&[
        "-o",
        out_dir.to_str().unwrap(),
        "--",
        bin("pool_workload").to_str().unwrap(),
        "--pool",
        "pta",
        "--legacy-name",
        "--steps",
        "2",
        "--log",
        log.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let rows = rows_of(&out_dir, parse_log(&log).pid);
    assert_eq!(
        pool_rows(&rows, "MALLOC", "PTA"),
        gt_regions(&log, "REGION_MALLOC")
    );
}

#[test]
fn steps_option_keeps_only_the_listed_steps() {
    if !require_root("steps_option_keeps_only_the_listed_steps") {
        return;
    }
    let _serial = serial();
    let (_dir, out_dir, pid, stderr, log) = trace_pool("pta", &["--steps=2"]);
    let rows = rows_of(&out_dir, pid);
    let text = std::fs::read_to_string(&log).unwrap();
    let step2: Vec<_> = {
        let mut v: Vec<_> = text
            .lines()
            .filter(|l| l.starts_with("REGION_MALLOC ") && l.ends_with(" step=2"))
            .map(|l| {
                let f: BTreeMap<&str, &str> = l
                    .split(' ')
                    .skip(1)
                    .filter_map(|kv| kv.split_once('='))
                    .collect();
                (
                    f["tid"].parse::<u32>().unwrap(),
                    f["dev"].to_string(),
                    u64::from_str_radix(f["addr"].trim_start_matches("0x"), 16).unwrap(),
                    f["size"].parse::<u64>().unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(step2.len(), 40);
    assert_eq!(pool_rows(&rows, "MALLOC", "PTA"), step2);
    // The HAL segments were allocated before step 1: not kept.
    assert!(rows.iter().all(|r| r.event_type != "HAL"));
    assert_eq!(
        rows.iter()
            .filter(|r| r.event_type == "Range_start")
            .count(),
        1
    );
    assert_eq!(
        rows.iter().filter(|r| r.event_type == "Range_end").count(),
        1
    );
    // --steps turns leak analysis off.
    assert!(
        !stderr.contains("leak report") && !stderr.contains("Detected memory leaks"),
        "{stderr}"
    );
}

#[test]
fn offline_analyze_replays_the_pool_step_analyses() {
    if !require_root("offline_analyze_replays_the_pool_step_analyses") {
        return;
    }
    let _serial = serial();
    let (_dir, out_dir, pid, online, _) = trace_pool("mindspore", &[]);
    let dump = find_files(
        &process_dir(&out_dir, pid).unwrap().join("device_1"),
        "memscope_dump_",
    )[0]
    .clone();
    let out = run_tracer(&[
        "analyze",
        "--input",
        dump.to_str().unwrap(),
        "-o",
        out_dir.join("offline").to_str().unwrap(),
    ]);
    let offline = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{offline}");
    let device1 = |text: &str| -> Vec<String> {
        let start = text
            .find("Detected memory leaks on device 1")
            .expect("device 1 report");
        text[start..]
            .lines()
            .take(3)
            .map(|l| l.trim_start_matches("[memscope-bpf] ").to_string())
            .collect()
    };
    assert_eq!(device1(&offline), device1(&online));
    assert!(
        offline.contains("Mindspore memory pool Gap Analysis of Device 1"),
        "{offline}"
    );
}

#[test]
fn decompose_totals_add_up_to_the_live_memory_at_every_step() {
    if !require_root("decompose_totals_add_up_to_the_live_memory_at_every_step") {
        return;
    }
    let _serial = serial();
    let (_dir, out_dir, pid, stderr, log) = trace_pool("pta", &["--analysis=leaks,decompose"]);
    // Live bytes at each step end, from the workload's own log: driver blocks (the pool's
    // segments) and pool regions.
    let text = std::fs::read_to_string(&log).unwrap();
    let (mut hal, mut regions, mut at_step_end) = (0i64, 0i64, Vec::new());
    for l in text.lines() {
        let size = |l: &str| -> i64 {
            l.split("size=")
                .nth(1)
                .unwrap()
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        };
        match l.split(' ').next().unwrap() {
            "MALLOC" => hal += size(l),
            "FREE" => hal -= size(l),
            "REGION_MALLOC" => regions += size(l),
            "REGION_FREE" => regions -= size(l),
            "RANGE_END" => at_step_end.push((hal, regions)),
            _ => {}
        }
    }
    assert_eq!(at_step_end.len(), 3);
    let pdir = process_dir(&out_dir, pid).unwrap();
    let csv = std::fs::read_to_string(&find_files(&pdir, "decompose_")[0]).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("Step,Owner,Current(byte),Peak(byte)"));
    let mut per_step: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for l in lines {
        let c: Vec<&str> = l.split(',').collect();
        let bytes: i64 = c[2].parse().unwrap();
        let e = per_step.entry(c[0].to_string()).or_default();
        if c[1].starts_with("CANN@") {
            e.0 += bytes;
        } else {
            assert_eq!(c[1], "PTA");
            e.1 += bytes;
        }
    }
    for (i, want) in at_step_end.iter().enumerate() {
        assert_eq!(per_step[&(i + 1).to_string()], *want, "step {}", i + 1);
    }
    // Every MALLOC row names its owner; the summary shows the breakdown.
    let rows = rows_of(&out_dir, pid);
    for r in rows.iter().filter(|r| r.event == "MALLOC") {
        let want = if r.event_type == "HAL" {
            "CANN@APP"
        } else {
            "PTA"
        };
        assert_eq!(r.attr["owner"], want);
    }
    assert!(stderr.contains("memory by owner (decompose)"), "{stderr}");
}
