//! Free disk space before a test run, and the run's own temporary directory.
//!
//! A full disk shows up deep inside rustc or pip as an I/O error; checking first turns that into
//! one clear line. The tests' temporary files go to a directory of their own that each run
//! empties first, so no run can leave the disk fuller than the one before.

use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::torch_bed;

const GIB: u64 = 1 << 30;

/// Bytes available to unprivileged users on the file system holding `path` (`df`'s "avail").
pub fn free_bytes(path: &Path) -> Result<u64> {
    let out = Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(path)
        .output()
        .context("running df")?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .with_context(|| format!("unexpected df output for {}: {text:?}", path.display()))
}

/// What a test run still has to write: a cold debug build of the workspace with its BPF object
/// and the fuzzer's build (6.2 GiB in target/, 6.6 GiB at the run's fullest, measured on a
/// fresh clone; the 3 GiB once written here was half of it), the torch test bed's venvs when
/// not installed yet (~6 GiB each with PyPI torch's CUDA wheels, 2 GiB for the two without
/// them), the release matrix's libraries (3.5 GB for 47 x86-64 releases, 3.0 GB for their
/// aarch64 builds) and room for the traces the tests write.
fn needed_bytes(repo: &Path) -> u64 {
    // `cargo xtask` has built xtask itself by now: look for the tracer's own build.
    let build = if repo.join("target/debug/memscope-bpf").is_file() {
        GIB
    } else {
        7 * GIB
    };
    let bed = if torch_bed::enabled() && !torch_bed::installed() {
        21 * GIB
    } else {
        0
    };
    let matrix = if torch_bed::enabled() && !torch_bed::matrix_fetched() {
        7 * GIB
    } else {
        0
    };
    // The mindspore venv: ~2.8 GB installed, the 804 MB wheel on the way.
    let mindspore = if crate::mindspore_bed::enabled() && !crate::mindspore_bed::installed() {
        4 * GIB
    } else {
        0
    };
    // The CUDA venv: ~4.5 GB installed, the 888 MB wheel on the way.
    let cuda = if crate::cuda_bed::enabled() && !crate::cuda_bed::installed() {
        6 * GIB
    } else {
        0
    };
    build + bed + matrix + mindspore + cuda
}

/// Fails with a clear message when the disk cannot hold the run.
pub fn preflight(repo: &Path) -> Result<()> {
    let free = free_bytes(repo)?;
    let needed = needed_bytes(repo);
    println!(
        "[test] disk: {:.1} GiB free, this run needs about {:.1} GiB",
        free as f64 / GIB as f64,
        needed as f64 / GIB as f64
    );
    if free < needed {
        bail!(
            "not enough free disk space for the test run: {:.1} GiB free on the file system of {}, \
             about {:.1} GiB needed (the build in target/, the torch test bed's venvs in {} when \
             missing, and the tests' traces). Free some space (e.g. `cargo clean` in other \
             checkouts) and run again.",
            free as f64 / GIB as f64,
            repo.display(),
            needed as f64 / GIB as f64,
            torch_bed::cache_dir()?.display()
        );
    }
    Ok(())
}

/// The tests' `TMPDIR`, emptied before each run: one directory per checkout (named by its
/// inode) under the system's temporary directory (which every user can traverse, as the tests
/// that drop privileges need), so two checkouts testing at once do not empty each other's.
pub fn fresh_test_tmp(repo: &Path) -> Result<PathBuf> {
    let checkout = fs::metadata(repo)
        .with_context(|| format!("reading {}", repo.display()))?
        .ino();
    let dir = std::env::temp_dir().join(format!("memscope-bpf-tests-{checkout}"));
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("emptying {}", dir.display()))?;
    }
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// After a passing run: says what the tests left behind (each test removes its own scratch
/// directory, so this should be nothing) and removes it.
pub fn sweep_test_tmp(dir: &Path) -> Result<()> {
    let left: Vec<String> = fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    if !left.is_empty() {
        println!(
            "[test] note: the tests left {} entries in {} ({}); removing them",
            left.len(),
            dir.display(),
            left.join(", ")
        );
    }
    fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))
}
