//! Every torch_npu release PyPI serves for cp311 x86-64 and aarch64, located statically: the
//! report function's file offset, its `MemoryUsage` layout and its direct callers must be those
//! of an independent reading (capstone's disassembly, `tests/tools/torch_npu_reading.py`, which
//! reads the layout from the function's own body rather than its callers' stores), recorded in
//! `tests/data/torch_npu_x86_64.tsv` and `tests/data/torch_npu_aarch64.tsv`. The aarch64
//! libraries are read on this host: locating is static, so the A64 search is checked on every
//! release without an arm64 machine. The releases span every build style seen so far: GNU ld
//! with one log string per event, GNU ld with each event logged twice (2.7.1.post4 on), mold
//! (`.rodata.str1.8`, code 0x1000 away from its file offset) and a shipped `.symtab` (2.9.1).
//!
//! The wheels come from PyPI once (`cargo xtask setup`, or this test when they are missing)
//! into `$MEMSCOPE_BPF_CACHE` (default `~/.cache/memscope-bpf`, `torch_npu_libs` and
//! `torch_npu_libs_aarch64`); only `libtorch_npu.so` and `version.py` are kept. No root, no
//! torch, no BPF. `MEMSCOPE_TORCH_BED=off` skips it, as it does the rest of the test bed.

mod common;

use std::{path::PathBuf, process::Command};

use common::repo_root;
use memscope_bpf::trace::torch_npu::{Probes, UsageLayout, locate};

/// One row of the independent reading.
struct Expected {
    version: String,
    file_offset: u64,
    layout: UsageLayout,
    callers: usize,
}

fn matrix(platform: &str) -> Vec<Expected> {
    let text = std::fs::read_to_string(
        repo_root().join(format!("probe-user/tests/data/torch_npu_{platform}.tsv")),
    )
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

/// Where tests/tools/torch_npu_wheels.py keeps one platform's libraries.
fn libs(platform: &str) -> &'static str {
    match platform {
        "x86_64" => "torch_npu_libs",
        _ => "torch_npu_libs_aarch64",
    }
}

#[test]
fn every_cp311_x86_64_release_is_located_as_an_independent_reading_says() {
    check_matrix(
        "x86_64",
        "every_cp311_x86_64_release_is_located_as_an_independent_reading_says",
    );
}

#[test]
fn every_cp311_aarch64_release_is_located_as_an_independent_reading_says() {
    check_matrix(
        "aarch64",
        "every_cp311_aarch64_release_is_located_as_an_independent_reading_says",
    );
}

/// Fetches the releases' libraries (once); false, having said SKIPPED, when they cannot be.
fn fetched<'a>(test: &str, platform: &str, versions: impl Iterator<Item = &'a str>) -> bool {
    if std::env::var("MEMSCOPE_TORCH_BED").is_ok_and(|v| v == "off") {
        eprintln!("SKIPPED {test}: MEMSCOPE_TORCH_BED=off (no torch_npu wheels fetched)");
        println!("SKIPPED {test}: MEMSCOPE_TORCH_BED=off");
        return false;
    }
    let fetch = Command::new("python3")
        .arg(repo_root().join("tests/tools/torch_npu_wheels.py"))
        .arg(cache())
        .arg(platform)
        .args(versions)
        .output()
        .expect("run python3");
    let said = String::from_utf8_lossy(&fetch.stdout);
    if !fetch.status.success() {
        eprintln!(
            "SKIPPED {test}: the torch_npu wheels could not be downloaded: {said}{}",
            String::from_utf8_lossy(&fetch.stderr)
        );
        println!("SKIPPED {test}: no torch_npu wheels");
        return false;
    }
    eprintln!("{}", said.trim());
    true
}

/// Code that fits no known pattern is refused with the reason, never read on a guess: in
/// torch_npu 2.1.0.post13 (aarch64) the FREE report's `component_type` and `data_type` bytes
/// come from `mov w2, #0x100` at 0x7da72c (`strh w2, [sp, #154]`, the struct at `sp + 152`);
/// made `#0x200` (`data_type` 2 after a 0) they fit neither layout, and the library is not
/// located at all.
#[test]
fn an_aarch64_free_report_that_fits_no_layout_is_refused() {
    let test = "an_aarch64_free_report_that_fits_no_layout_is_refused";
    let version = "2.1.0.post13";
    if !fetched(test, "aarch64", [version].into_iter()) {
        return;
    }
    let lib = cache().join(format!(
        "{}/{version}/torch_npu/lib/libtorch_npu.so",
        libs("aarch64")
    ));
    let mut bytes = std::fs::read(&lib).unwrap();
    const MOV_W2_0X100: u32 = 0x5280_2002;
    const MOV_W2_0X200: u32 = 0x5280_4002;
    let at = 0x7da72c;
    let word = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    assert_eq!(
        word, MOV_W2_0X100,
        "{version}'s FREE report is not where it was"
    );
    let tmp = std::env::temp_dir().join(format!("memscope-patched-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let patched = tmp.join("libtorch_npu.so");
    // Unpatched first: the same copy is located, so the refusal below is the patch's doing.
    std::fs::write(&patched, &bytes).unwrap();
    if let Err(e) = locate(&patched) {
        panic!("the unpatched copy is not located: {e:#}");
    }
    bytes[at..at + 4].copy_from_slice(&MOV_W2_0X200.to_le_bytes());
    std::fs::write(&patched, &bytes).unwrap();
    let why = format!("{:#}", locate(&patched).unwrap_err());
    std::fs::remove_dir_all(&tmp).unwrap();
    assert!(
        why.contains("fit no known MemoryUsage layout (byte 2: Some(0), byte 3: Some(2))"),
        "{why}"
    );
}

fn check_matrix(platform: &str, test: &str) {
    let matrix = matrix(platform);
    assert!(
        matrix.len() >= 40,
        "the table lists {} releases",
        matrix.len()
    );
    if !fetched(test, platform, matrix.iter().map(|e| e.version.as_str())) {
        return;
    }
    let mut wrong = Vec::new();
    let mut left_out = Vec::new();
    for e in &matrix {
        let lib = cache().join(format!(
            "{}/{}/torch_npu/lib/libtorch_npu.so",
            libs(platform),
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
                // The probes go on the call sites, each direct call either probed or a
                // BLOCK_FREE-only site left out: as many as the reading's direct calls.
                match &site.probes {
                    Probes::CallSites { sites, block_free }
                        if sites.len() + block_free == e.callers =>
                    {
                        left_out.push(format!("{}:{block_free}", e.version))
                    }
                    other => wrong.push(format!(
                        "{}: probes {other:x?}, the reading has {} direct calls",
                        e.version, e.callers
                    )),
                }
            }
            Err(why) => wrong.push(format!("{}: not located: {why:#}", e.version)),
        }
    }
    eprintln!(
        "BLOCK_FREE-only call sites left unprobed: {}",
        left_out.join(" ")
    );
    assert!(
        wrong.is_empty(),
        "{} of {} releases differ:\n{}",
        wrong.len(),
        matrix.len(),
        wrong.join("\n")
    );
}
