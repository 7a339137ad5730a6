//! torch_npu's report function is read only when we are sure of it. A simulated
//! `libtorch_npu.so` (tests/fixtures/src/fake_torch_npu.c) has what the search looks for, and
//! `pta_workload` carves blocks from one HAL segment through it:
//!
//! * with one report function and real-looking blocks, every block is a PTA row (the control:
//!   the fixture is recognised, so what the other two runs lack is the tracer's refusal);
//! * when the code names two report functions, the search says so once and the run has HAL
//!   rows and no PTA row;
//! * when the found function's first report is not a `MemoryUsage` (an odd block pointer), one
//!   warning says so and no PTA row is written, not even for the later, plausible reports;
//! * each freed block's BLOCK_FREE report (no row needs it) never leaves BPF.
//!
//! Ground truth is what the workload printed (its segment and blocks).

mod common;

use common::*;

/// What one traced run of `pta_workload` left.
struct Run {
    stderr: String,
    hal: Vec<u64>,
    blocks: Vec<u64>,
    rows: Vec<DumpRow>,
    /// Records the tracer received (its closing `N events, none lost`).
    events: u64,
}

fn run(test: &str, variant: &str, extra: &[&str]) -> Option<Run> {
    if !require_root(test) {
        return None;
    }
    let _serial = serial();
    let dir = scratch(test);
    let out_dir = dir.join("out");
    let lib = fixtures().join(format!("lib/pta/{variant}/libtorch_npu.so"));
    let workload = bin("pta_workload");
    let mut args = vec![
        "-o",
        out_dir.to_str().unwrap(),
        "--",
        workload.to_str().unwrap(),
        lib.to_str().unwrap(),
    ];
    args.extend(extra);
    let out = run_tracer(&args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "tracer failed:\n{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |kind: &str| -> Vec<u64> {
        stdout
            .lines()
            .filter_map(|l| l.strip_prefix(kind))
            .map(|l| {
                hex(l
                    .split_whitespace()
                    .next()
                    .unwrap()
                    .trim_start_matches("addr="))
            })
            .collect()
    };
    let pid: u32 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("PID "))
        .expect("the workload's pid")
        .parse()
        .unwrap();
    let events = stderr
        .lines()
        .find_map(|l| {
            l.trim_start_matches("[memscope-bpf] ")
                .strip_suffix(" events, none lost")?
                .parse()
                .ok()
        })
        .unwrap_or(0);
    Some(Run {
        events,
        hal: field("HAL "),
        blocks: field("BLOCK "),
        rows: rows_of(&out_dir, pid),
        stderr,
    })
}

fn addrs(rows: &[DumpRow], event_type: &str, event: &str) -> Vec<u64> {
    rows.iter()
        .filter(|r| r.event_type == event_type && r.event == event)
        .map(|r| r.addr())
        .collect()
}

/// The tracer's warnings about torch_npu.
fn torch_npu_warnings(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains("warning:") && l.contains("torch_npu"))
        .collect()
}

#[test]
fn a_recognised_fake_torch_npu_gives_a_pta_row_per_block() {
    let Some(run) = run(
        "a_recognised_fake_torch_npu_gives_a_pta_row_per_block",
        "one",
        &[],
    ) else {
        return;
    };
    assert_eq!(run.blocks.len(), 4);
    assert_eq!(
        addrs(&run.rows, "PTA", "MALLOC"),
        run.blocks,
        "{}",
        run.stderr
    );
    assert_eq!(
        addrs(&run.rows, "PTA", "FREE"),
        run.blocks,
        "{}",
        run.stderr
    );
    assert_eq!(addrs(&run.rows, "HAL", "MALLOC"), run.hal);
    assert_eq!(torch_npu_warnings(&run.stderr), Vec::<&str>::new());
}

/// torch_npu reports every freed block twice, BLOCK_FREE then FREE; only the FREE makes a
/// row, so BPF drops the BLOCK_FREE at the probe (no record, no stack read for it). Two runs
/// that differ only in the number of blocks the workload carves: each further block costs
/// exactly its MALLOC and FREE records (3 with the BLOCK_FREE sent).
#[test]
fn a_block_free_report_sends_nothing_to_user_space() {
    const TEST: &str = "a_block_free_report_sends_nothing_to_user_space";
    let Some(few) = run(TEST, "one", &["--blocks", "4"]) else {
        return;
    };
    let many = run(TEST, "one", &["--blocks", "12"]).expect("root");
    let extra = (many.blocks.len() - few.blocks.len()) as u64;
    assert_eq!(extra, 8, "the workload's own block lines");
    // Every block is still a MALLOC and a FREE row.
    for r in [&few, &many] {
        assert_eq!(addrs(&r.rows, "PTA", "MALLOC"), r.blocks, "{}", r.stderr);
        assert_eq!(addrs(&r.rows, "PTA", "FREE"), r.blocks, "{}", r.stderr);
    }
    assert!(few.events > 0, "no event total:\n{}", few.stderr);
    assert_eq!(
        many.events - few.events,
        2 * extra,
        "records for {extra} more blocks:\n{}",
        many.stderr
    );
}

#[test]
fn candidates_that_disagree_give_one_warning_hal_rows_and_no_pta_row() {
    let Some(run) = run(
        "candidates_that_disagree_give_one_warning_hal_rows_and_no_pta_row",
        "two",
        &[],
    ) else {
        return;
    };
    let warnings = torch_npu_warnings(&run.stderr);
    assert_eq!(warnings.len(), 1, "{}", run.stderr);
    assert!(
        warnings[0].contains("2 candidates for report function"),
        "{}",
        warnings[0]
    );
    assert_eq!(addrs(&run.rows, "HAL", "MALLOC"), run.hal);
    assert_eq!(addrs(&run.rows, "HAL", "FREE"), run.hal);
    assert!(
        !run.rows.iter().any(|r| r.event_type == "PTA"),
        "no PTA row from a guess"
    );
}

#[test]
fn a_found_function_that_gets_no_memory_usage_gives_one_warning_and_no_pta_row() {
    let Some(run) = run(
        "a_found_function_that_gets_no_memory_usage_gives_one_warning_and_no_pta_row",
        "one",
        &["--misaligned-first"],
    ) else {
        return;
    };
    assert_eq!(run.blocks[0] % 2, 1, "the first block is odd");
    let warnings = torch_npu_warnings(&run.stderr);
    assert_eq!(warnings.len(), 1, "{}", run.stderr);
    assert!(
        warnings[0].contains(&format!("block pointer {:#x}", run.blocks[0])),
        "{}",
        warnings[0]
    );
    assert_eq!(addrs(&run.rows, "HAL", "MALLOC"), run.hal);
    assert_eq!(addrs(&run.rows, "HAL", "FREE"), run.hal);
    assert!(
        !run.rows.iter().any(|r| r.event_type == "PTA"),
        "no PTA row once the function is doubted, not even for the later blocks"
    );
}

/// The report function's address by `nm`'s reading of the fixture's `.symtab` (its code is
/// where GNU ld put it: file offset = address in so small a library).
fn nm_address(lib: &std::path::Path, name: &str) -> u64 {
    let out = std::process::Command::new("nm")
        .arg(lib)
        .output()
        .expect("run nm");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text
        .lines()
        .find(|l| l.ends_with(&format!(" {name}")))
        .unwrap_or_else(|| panic!("nm does not list {name} in {}", lib.display()));
    hex(line.split_whitespace().next().unwrap())
}

const REPORT_SYMBOL: &str =
    "_ZN9torch_npu8profiler29reportMemoryDataToNpuProfilerERKNS0_11MemoryUsageE";

#[test]
fn a_symbol_table_that_agrees_with_the_code_is_used_and_one_that_does_not_is_refused() {
    use memscope_bpf::trace::torch_npu::{UsageLayout, locate};
    let one = fixtures().join("lib/pta/one/libtorch_npu.so");
    let site = locate(&one).unwrap();
    assert_eq!(
        (site.file_offset, site.layout, site.callers),
        (
            nm_address(&one, REPORT_SYMBOL),
            UsageLayout::WithComponent,
            4
        ),
        "malloc, free, the block's free and the workspace call it"
    );
    let misnamed = fixtures().join("lib/pta/misnamed/libtorch_npu.so");
    let named = nm_address(&misnamed, REPORT_SYMBOL);
    let why = format!("{:#}", locate(&misnamed).unwrap_err());
    assert!(
        why.contains("2 candidates for report function") && why.contains(&format!("{named:x}")),
        "{why}"
    );
}
