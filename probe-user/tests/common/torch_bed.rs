//! The real-framework test bed: the released torch + torch_npu wheels (venvs installed by
//! `cargo xtask setup`) on the simulated CANN (tests/fixtures/cann), running
//! tests/fixtures/python/torch_npu_train.py.

use std::path::{Path, PathBuf};

use super::{repo_root, require_root};

/// The test bed's venvs (`MEMSCOPE_TORCH_VENVS`, set by `cargo xtask test` unless
/// `MEMSCOPE_TORCH_BED=off`), or a loud skip (also when not root).
pub fn torch_venvs(test: &str) -> Option<Vec<PathBuf>> {
    if !require_root(test) {
        return None;
    }
    let Some(v) = std::env::var_os("MEMSCOPE_TORCH_VENVS") else {
        eprintln!(
            "SKIPPED {test}: MEMSCOPE_TORCH_VENVS is not set (run through `cargo xtask test`, \
             which installs the torch/torch_npu test bed unless MEMSCOPE_TORCH_BED=off)"
        );
        println!("SKIPPED {test}: no torch test bed");
        return None;
    };
    let (venvs, absent): (Vec<PathBuf>, Vec<PathBuf>) = std::env::split_paths(&v)
        .filter(|p| !p.as_os_str().is_empty())
        .partition(|venv| venv.join("bin/python").is_file());
    // A release this machine's bed does not have yet (set up before it joined the bed).
    for venv in &absent {
        eprintln!(
            "SKIPPED {test} on {}: MEMSCOPE_TORCH_VENVS names it but it has no bin/python \
             (`cargo xtask setup` installs it)",
            venv.display()
        );
        println!("SKIPPED {test} on {}: not installed", venv.display());
    }
    if venvs.is_empty() {
        println!("SKIPPED {test}: no venv of the torch test bed is installed");
        return None;
    }
    Some(venvs)
}

/// How many times longer than on the host the bed's waits may take: `MEMSCOPE_TEST_PATIENCE`
/// (the arm64 VM's emulated CPU sets it: `import torch` alone takes minutes there), default 1.
pub fn patience() -> u64 {
    std::env::var("MEMSCOPE_TEST_PATIENCE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

/// The simulated CANN install's directory (asserted to be built): beside the fixtures given
/// in `MEMSCOPE_FIXTURES_DIR` (the arm64 VM's, cross-built) or in tests/fixtures/build.
pub fn cann_dir() -> PathBuf {
    let fixtures = std::env::var_os("MEMSCOPE_FIXTURES_DIR")
        .map_or_else(|| repo_root().join("tests/fixtures/build"), PathBuf::from);
    let cann = fixtures.join("cann");
    assert!(
        cann.join("lib64/libascendcl.so").is_file(),
        "no simulated CANN at {} (cargo xtask setup builds it)",
        cann.display()
    );
    cann
}

/// The simulated CANN's environment, as its `set_env.sh` would set it up.
pub fn cann_env() -> Vec<(String, String)> {
    let cann = cann_dir();
    let lib = cann.join("lib64").display().to_string();
    let path = match std::env::var("LD_LIBRARY_PATH") {
        Ok(old) if !old.is_empty() => format!("{lib}:{old}"),
        _ => lib,
    };
    vec![
        ("ASCEND_HOME_PATH".into(), cann.display().to_string()),
        (
            "ASCEND_OPP_PATH".into(),
            cann.join("opp").display().to_string(),
        ),
        ("LD_LIBRARY_PATH".into(), path),
    ]
}

/// The training script the test bed runs.
pub fn torch_script() -> PathBuf {
    repo_root().join("tests/fixtures/python/torch_npu_train.py")
}

/// A venv's release name (its directory name, e.g. `torch-2.8.0_npu-2.8.0.post2`).
pub fn bed_release(venv: &Path) -> String {
    venv.file_name().unwrap().to_string_lossy().into_owned()
}

/// capstone's reading of one torch_npu release (report function's file offset, `MemoryUsage`
/// layout, direct callers) in the release matrix's table (tests/tools/torch_npu_reading.py,
/// real_torch_matrix.rs): the independent figures for releases gdb and objdump did not read.
pub fn capstone_reading(
    version: &str,
) -> Option<(u64, memscope_bpf::trace::torch_npu::UsageLayout, usize)> {
    use memscope_bpf::trace::torch_npu::UsageLayout;
    let table =
        std::fs::read_to_string(repo_root().join("probe-user/tests/data/torch_npu_x86_64.tsv"))
            .unwrap();
    let row = table
        .lines()
        .find(|l| l.split('\t').next() == Some(version))?;
    let f: Vec<&str> = row.split('\t').collect();
    let layout = match f[2] {
        "original" => UsageLayout::Original,
        "with_component" => UsageLayout::WithComponent,
        other => panic!("unknown layout {other} in the table"),
    };
    let offset = u64::from_str_radix(f[1].trim_start_matches("0x"), 16).unwrap();
    Some((offset, layout, f[3].parse().unwrap()))
}
