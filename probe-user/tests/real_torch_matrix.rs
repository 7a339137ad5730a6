//! Every torch_npu release PyPI serves for cp311 x86-64, located statically: the report
//! function's file offset, its `MemoryUsage` layout and its direct callers must be those of an
//! independent reading (capstone's disassembly, `tests/tools/torch_npu_reading.py`, which reads
//! the layout from the function's own body rather than its callers' stores), recorded in
//! `tests/data/torch_npu_x86_64.tsv`. The releases span every build style seen so far: GNU ld
//! with one log string per event, GNU ld with each event logged twice (2.7.1.post4 on), mold
//! (`.rodata.str1.8`, code 0x1000 away from its file offset) and a shipped `.symtab` (2.9.1).
//!
//! The wheels come from PyPI once (`cargo xtask setup`, or this test when they are missing)
//! into `$MEMSCOPE_BPF_CACHE` (default `~/.cache/memscope-bpf`); only `libtorch_npu.so` and
//! `version.py` are kept. No root, no torch, no BPF. `MEMSCOPE_TORCH_BED=off` skips it, as it
//! does the rest of the test bed.

mod common;

use std::{path::PathBuf, process::Command};

use common::repo_root;
use memscope_bpf::trace::torch_npu::{UsageLayout, locate};

/// One row of the independent reading.
struct Expected {
    version: String,
    file_offset: u64,
    layout: UsageLayout,
    callers: usize,
}

fn matrix() -> Vec<Expected> {
    let text =
        std::fs::read_to_string(repo_root().join("probe-user/tests/data/torch_npu_x86_64.tsv"))
            .unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            Expected {
                version: f[0].to_owned(),
                file_offset: u64::from_str_radix(f[1].trim_start_matches("0x"), 16).unwrap(),
                layout: match f[2] {
                    "original" => UsageLayout::Original,
                    "with_component" => UsageLayout::WithComponent,
                    other => panic!("unknown layout {other} in the table"),
                },
                callers: f[3].parse().unwrap(),
            }
        })
        .collect()
}

fn cache() -> PathBuf {
    match std::env::var_os("MEMSCOPE_BPF_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/memscope-bpf"),
    }
}

#[test]
fn every_cp311_x86_64_release_is_located_as_an_independent_reading_says() {
    let test = "every_cp311_x86_64_release_is_located_as_an_independent_reading_says";
    let matrix = matrix();
    assert!(
        matrix.len() >= 40,
        "the table lists {} releases",
        matrix.len()
    );
    if std::env::var("MEMSCOPE_TORCH_BED").is_ok_and(|v| v == "off") {
        eprintln!("SKIPPED {test}: MEMSCOPE_TORCH_BED=off (no torch_npu wheels fetched)");
        println!("SKIPPED {test}: MEMSCOPE_TORCH_BED=off");
        return;
    }
    let fetch = Command::new("python3")
        .arg(repo_root().join("tests/tools/torch_npu_wheels.py"))
        .arg(cache())
        .arg("x86_64")
        .args(matrix.iter().map(|e| &e.version))
        .output()
        .expect("run python3");
    let said = String::from_utf8_lossy(&fetch.stdout);
    if !fetch.status.success() {
        eprintln!(
            "SKIPPED {test}: the torch_npu wheels could not be downloaded: {said}{}",
            String::from_utf8_lossy(&fetch.stderr)
        );
        println!("SKIPPED {test}: no torch_npu wheels");
        return;
    }
    eprintln!("{}", said.trim());
    let mut wrong = Vec::new();
    for e in &matrix {
        let lib = cache().join(format!(
            "torch_npu_libs/{}/torch_npu/lib/libtorch_npu.so",
            e.version
        ));
        match locate(&lib) {
            Ok(site) => {
                assert_eq!(site.version.as_deref(), Some(e.version.as_str()));
                let got = (site.file_offset, site.layout, site.callers);
                if got != (e.file_offset, e.layout, e.callers) {
                    wrong.push(format!(
                        "{}: found {got:x?}, the reading says {:x?}",
                        e.version,
                        (e.file_offset, e.layout, e.callers)
                    ));
                }
            }
            Err(why) => wrong.push(format!("{}: not located: {why:#}", e.version)),
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} releases differ:\n{}",
        wrong.len(),
        matrix.len(),
        wrong.join("\n")
    );
}
