//! The real-framework test bed: the released `torch` and `torch_npu` wheels from PyPI in cached
//! virtual environments, and the simulated CANN they run on (`make -C tests/fixtures cann`).
//!
//! Two torch_npu releases whose `MemoryUsage` layouts differ (see probe-user/src/trace/torch_npu.rs)
//! are pinned. PyPI's x86-64 torch is the CUDA build: with its `nvidia-*` dependencies a venv
//! is about 6 GB, so the venvs live outside the repository (`$MEMSCOPE_BPF_CACHE`, default
//! `~/.cache/memscope-bpf/venvs`) and are made once; a finished one holds a `.memscope-ready`
//! marker. torch_npu pins a `+cpu` torch build that PyPI does not serve, so it is installed
//! with `--no-deps` next to PyPI's torch of the same version.
//!
//! `MEMSCOPE_TORCH_BED=off` skips all of it (the tests that need it then say SKIPPED).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::cmd;

/// (torch, torch_npu, extra requirements) of each release in the bed.
pub const RELEASES: [(&str, &str, &[&str]); 2] = [
    // MemoryUsage with component_type (released 2026-01).
    ("2.8.0", "2.8.0.post2", &["numpy", "pyyaml"]),
    // The original MemoryUsage (git 9e105ea, 2025-04).
    ("2.5.1", "2.5.1", &["numpy<2", "pyyaml"]),
];

/// The environment variable the tests read the venvs from (`:`-separated).
pub const VENVS_ENV: &str = "MEMSCOPE_TORCH_VENVS";
const READY_MARKER: &str = ".memscope-ready";

pub fn enabled() -> bool {
    std::env::var("MEMSCOPE_TORCH_BED").map_or(true, |v| v != "off")
}

pub fn cache_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("MEMSCOPE_BPF_CACHE") {
        return Ok(PathBuf::from(dir).join("venvs"));
    }
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    Ok(PathBuf::from(home).join(".cache/memscope-bpf/venvs"))
}

/// The venv directory of one release.
pub fn venv(torch: &str, npu: &str) -> Result<PathBuf> {
    Ok(cache_dir()?.join(format!("torch-{torch}_npu-{npu}")))
}

/// The venvs, in `RELEASES` order, as the tests want them.
pub fn venvs() -> Result<Vec<PathBuf>> {
    RELEASES.iter().map(|(t, n, _)| venv(t, n)).collect()
}

/// True when every release's venv is installed and ready.
pub fn installed() -> bool {
    venvs().is_ok_and(|dirs| dirs.iter().all(|d| d.join(READY_MARKER).is_file()))
}

/// Makes every venv that is not ready yet, then the simulated CANN for all of them.
pub fn prepare(repo: &Path) -> Result<String> {
    let mut made = Vec::new();
    let mut sites = Vec::new();
    for (torch, npu, extra) in RELEASES {
        let dir = venv(torch, npu)?;
        if !dir.join(READY_MARKER).is_file() {
            println!(
                "[setup] torch test bed: installing torch=={torch} and torch_npu=={npu} into {} \
                 (PyPI's CUDA build of torch with its nvidia-* wheels: ~4 GB to download once)",
                dir.display()
            );
            make_venv(&dir, torch, npu, extra)?;
            made.push(npu);
        }
        sites.push(site_packages(&dir)?);
    }
    let mut make = Command::new("make");
    make.current_dir(repo)
        .args(["-s", "-C", "tests/fixtures", "cann"])
        .arg(format!(
            "CANN_SITES={}",
            sites
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" ")
        ));
    cmd::output(&mut make).context("building the simulated CANN for torch_npu")?;
    Ok(format!(
        "torch_npu {}; {}",
        RELEASES.map(|r| r.1).join(", "),
        if made.is_empty() {
            "venvs already installed".to_owned()
        } else {
            format!("installed {} now", made.join(", "))
        }
    ))
}

fn make_venv(dir: &Path, torch: &str, npu: &str, extra: &[&str]) -> Result<()> {
    if dir.exists() {
        // A half-made venv from an interrupted run.
        fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::create_dir_all(dir.parent().unwrap_or(dir))?;
    run(Command::new("python3").args(["-m", "venv"]).arg(dir))?;
    let pip = dir.join("bin/pip");
    run(Command::new(&pip)
        .args(["install", "-q", "--disable-pip-version-check"])
        .arg(format!("torch=={torch}"))
        .args(extra))?;
    run(Command::new(&pip)
        .args(["install", "-q", "--disable-pip-version-check", "--no-deps"])
        .arg(format!("torch-npu=={npu}")))?;
    fs::write(
        dir.join(READY_MARKER),
        format!("torch=={torch} torch_npu=={npu}\n"),
    )?;
    Ok(())
}

fn run(c: &mut Command) -> Result<()> {
    let status = cmd::interactive(c)?;
    if !status.success() {
        bail!("`{}` failed ({status})", cmd::describe(c));
    }
    Ok(())
}

fn site_packages(venv: &Path) -> Result<PathBuf> {
    let lib = venv.join("lib");
    for entry in fs::read_dir(&lib).with_context(|| format!("reading {}", lib.display()))? {
        let site = entry?.path().join("site-packages");
        if site.join("torch_npu").is_dir() {
            return Ok(site);
        }
    }
    bail!("no site-packages with torch_npu under {}", lib.display())
}
